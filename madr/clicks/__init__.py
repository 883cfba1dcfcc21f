"""Learning from click logs without inheriting the old ranker's position bias.

- `events`: one normalised event schema for OpenSearch User Behavior Insights (UBI) queries + events and for a
  plain impressions layout, and the row normalisers that validate them (bad rows are quarantined);
- `collapse`: one search's events -> its impressions (duplicate events dropped and counted, clicks placed);
- `log`: the in-process reader (files -> validated events -> impressions + summary), what
  `pipelines.data.click_log` runs on Ray Data;
- `examination`: the examination (position-bias) curve estimated from the log itself by EM under the
  position-based model (Wang et al., WSDM'18), written as JSON and plotted;
- `harvesting`: the same curve by intervention harvesting (Agarwal et al., WSDM'19): only the pairs the log shows at
  several ranks, AllPairs extremum estimator; `data.clicks.estimator: harvest`;
- `judgments`: impressions -> training judgments: clicked documents as positives with clipped inverse-propensity
  weights, skipped higher-ranked impressions as negatives (Joachims et al., WSDM'17; Agarwal et al., WSDM'19);
- `simulation`: a click log simulated from graded judgments with a known examination curve.
"""
