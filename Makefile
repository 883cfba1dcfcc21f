.PHONY: demo test test-slow test-e2e test-multinode lint

demo:  ## run the main job end to end on embedded defaults
	bash scripts/demo.sh

test:  ## ruff and the test suite, less the slow integration tests and the e2e demo flow (CI runs both next: .ci/run)
	MADR_TEST_WORKERS=$${MADR_TEST_WORKERS:-3} bash scripts/test.sh -m "not slow and not multinode and not e2e"

test-slow:  ## the slow integration tests (Ray Train jobs, Serve failure drills, 2-node training, benchmark tables)
	bash scripts/test.sh -m "slow and not multinode and not e2e"

test-e2e:  ## the demo flow through `ray job submit` on a local cluster; the README's cluster command on 2 nodes
	bash scripts/test.sh -m e2e tests/cluster

test-multinode:  ## encode and Serve on a 3-node local cluster, a node killed under load (tests/multinode)
	bash scripts/test.sh -m multinode tests/multinode

lint:
	.venv/bin/ruff check madr pipelines serve tests benchmarks
