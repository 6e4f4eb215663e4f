"""Issue 12: hub specs (hf://, ms://) downloaded through huggingface_hub and modelscope from a fake hub on
127.0.0.1 (tests/_hub_server.py): only the files conversion reads, resume, checksums, revisions, offline use, and
one-line errors. No other address is contacted (the `loopback_only` fixture fails the test if one is)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from _hub_server import Fault, HubServer
from ggufbridge.checkpoint import hub as hubmod
from ggufbridge.checkpoint.hub import HubSpec
from ggufbridge.checkpoint.model_dir import ModelDir, resolve_model_dir
from ggufbridge.cli import cli
from ggufbridge.compare.sources import hub_model, localize, parse_spec
from ggufbridge.errors import CheckpointError, HubError

REPO = "openbmb/MiniCPM-V-4_7-tiny"
# in the repo beside the checkpoint, never fetched: pickles, ONNX, code, images, git metadata
JUNK = {"pytorch_model.bin": b"\x80pickle" * 64, "model.onnx": b"onnx" * 64, "modeling_minicpmv.py": b"# code\n",
        "assets/demo.png": b"\x89PNG" * 64, ".gitattributes": b"*.safetensors filter=lfs\n"}
CARD = b"---\nlicense: apache-2.0\nbase_model:\n- openbmb/MiniCPM-V-4_7\n---\n# tiny\n"


@pytest.fixture(scope="module")
def ckpt(make_ckpt):
    return make_ckpt("tiny", vocab="small", max_shard_size="200KB")  # 11 shards of ~200 KB


@pytest.fixture(scope="module")
def wanted(ckpt) -> dict[str, bytes]:
    """The files a download must bring: the checkpoint's, less the fixture's own notes, plus the model card."""
    files = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file() and p.name != "ggufbridge_fixture.json"}
    return files | {"README.md": CARD}


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Refuse (and record) any connection or name lookup that is not 127.0.0.1; the test fails if one happened."""
    outside = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def allowed(address) -> bool:
        return not isinstance(address, tuple) or address[0] in ("127.0.0.1", "localhost")

    def connect(sock, address):
        if not allowed(address):
            outside.append(address)
            raise OSError(f"test: connection to {address} refused (loopback only)")
        return real_connect(sock, address)

    def connect_ex(sock, address):
        if not allowed(address):
            outside.append(address)
            return 111
        return real_connect_ex(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost", None):
            outside.append(host)
            raise socket.gaierror(f"test: lookup of {host} refused (loopback only)")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield outside
    assert not outside, f"contacted outside 127.0.0.1: {outside}"


@pytest.fixture
def hub(tmp_path, monkeypatch, ckpt):
    """A fake hub serving REPO (the checkpoint + card + junk) on 127.0.0.1, both clients pointed at it, caches and
    config under tmp_path, no tokens, online."""
    import huggingface_hub.constants

    with HubServer() as fake:
        for k, v in {"HF_ENDPOINT": fake.url, "HF_HOME": tmp_path / "hf-home", "HF_HUB_CACHE": tmp_path / "hf",
                     "HF_HUB_DISABLE_TELEMETRY": "1", "MODELSCOPE_ENDPOINT": fake.url,
                     "MODELSCOPE_CACHE": tmp_path / "ms", "MODELSCOPE_HOME": tmp_path / "ms-home"}.items():
            monkeypatch.setenv(k, str(v))
        for k in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "MODELSCOPE_API_TOKEN", "MODELSCOPE_DOMAIN"):
            monkeypatch.delenv(k, raising=False)
        # read by huggingface_hub at import, so set here too; telemetry on, it fetches an "agent harness" list from
        # huggingface.co (once a day, while building its User-Agent): loopback_only caught that
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
        # write partial files in 64 KiB steps (default 10 MiB: bigger than these shards), so truncation leaves some
        monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
        fake.add(REPO, {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()} | {"README.md": CARD} | JUNK)
        yield fake


def _dead_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _shard(n: int = 9) -> str:
    return f"model-{n:05d}-of-00011.safetensors"


def _blob(tmp_path: Path, data: bytes) -> Path:
    return tmp_path / "hf" / f"models--{REPO.replace('/', '--')}" / "blobs" / hashlib.sha256(data).hexdigest()


# -- specs ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, expected", [
    ("hf://openbmb/MiniCPM-V-4.7", HubSpec("hf", "openbmb/MiniCPM-V-4.7")),
    ("hf://openbmb/MiniCPM-V-4.7@v1.0", HubSpec("hf", "openbmb/MiniCPM-V-4.7", "v1.0")),
    ("hf://gpt2", HubSpec("hf", "gpt2")),  # root-level HF repos have no organisation
    ("ms://OpenBMB/MiniCPM-V-4.7@master", HubSpec("ms", "OpenBMB/MiniCPM-V-4.7", "master")),
    ("openbmb/MiniCPM-V-4.7", None),  # a repo id in the HF cache: resolved offline, as before
    ("/models/minicpm", None),
    ("hf:/models/minicpm", None),  # compare's backend prefix, not a hub
])
def test_parse_spec(spec, expected):
    assert hubmod.parse_spec(spec) == expected


@pytest.mark.parametrize("spec", ["hf://", "hf://a/b/c", "ms://name-only", "hf://org/name@", "hf://org/x@a@b"])
def test_malformed_hub_specs_are_refused(spec):
    with pytest.raises(HubError, match="expected"):
        hubmod.parse_spec(spec)


def test_compare_specs_tell_hub_models_from_folders(tmp_path):
    assert hub_model("hf:hf://org/x@v2") == HubSpec("hf", "org/x", "v2")  # transformers backend on a download
    assert hub_model("hf://org/x") == HubSpec("hf", "org/x")  # bare: transformers too
    assert hub_model("hf:ms://org/x") == hub_model("ms://org/x") == HubSpec("ms", "org/x")
    assert hub_model(f"hf:{tmp_path}") is None and hub_model("gguf:m.gguf") is None
    assert parse_spec(f"hf:{tmp_path}") == ("hf", tmp_path)  # hf:DIR keeps its meaning
    assert localize("gguf:m.gguf") == "gguf:m.gguf"


def test_revision_conflict_and_local_folder(tmp_path):
    with pytest.raises(HubError, match="names revision v1, but --revision says v2"):
        hubmod.pinned(HubSpec("hf", "org/x", "v1"), "v2")
    assert hubmod.pinned(HubSpec("hf", "org/x"), "v2") == HubSpec("hf", "org/x", "v2")
    with pytest.raises(CheckpointError, match="local folder has no revisions"):
        resolve_model_dir(tmp_path, revision="v1")


# -- Hugging Face ---------------------------------------------------------------------------------------------------

def test_hf_download_fetches_only_what_conversion_reads(hub, tmp_path, wanted):
    path = resolve_model_dir(f"hf://{REPO}")
    commit = hub.repos[REPO]["main"].sha
    assert path == tmp_path / "hf" / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit
    assert _files(path) == wanted
    assert (path.parent.parent / "refs" / "main").read_text() == commit
    fetched = {r.path.rsplit("/", 1)[-1] for r in hub.requests("GET", "/resolve/")}
    assert fetched == set(wanted)  # the junk was never requested
    assert not list(path.parent.parent.rglob("*.incomplete"))
    md = ModelDir.open(path)
    assert len(md.shards) == 11 and md.config["architectures"] == ["MiniCPMV4_7ForConditionalGeneration"]
    # a second call finds every blob in the cache: no file is downloaded again
    hub.log.clear()
    assert resolve_model_dir(f"hf://{REPO}") == path
    assert not hub.requests("GET", "/resolve/")


def test_hf_unknown_repo_revision_and_offline_miss(hub, monkeypatch):
    with pytest.raises(HubError, match=r"^hf://openbmb/nope: repository not found \(a private or gated one needs "
                                       r"HF_TOKEN\)$"):
        resolve_model_dir("hf://openbmb/nope")
    with pytest.raises(HubError, match=f"^hf://{REPO}@v9: revision v9 not found$"):
        resolve_model_dir(f"hf://{REPO}@v9")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.log.clear()
    with pytest.raises(HubError, match="not .*in the HF cache at .*, and HF_HUB_OFFLINE is set"):
        resolve_model_dir(f"hf://{REPO}")
    assert not hub.log


def test_hf_offline_and_unreachable_hub_use_the_cache(hub, monkeypatch, tmp_path):
    path = resolve_model_dir(f"hf://{REPO}")
    hub.log.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_dir(f"hf://{REPO}") == path
    assert not hub.log  # offline: no request at all
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_dead_port()}")  # the hub is unreachable
    assert resolve_model_dir(f"hf://{REPO}") == path
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(HubError, match="not .*in the HF cache .*the hub cannot be reached"):
        resolve_model_dir(f"hf://{REPO}")


def test_hf_interrupted_download_resumes_with_a_range_request(hub, tmp_path, wanted):
    """The server sends part of a shard and then fails: error, nothing under a final name, the partial file kept;
    the next call asks for the rest only (Range) and the result is byte-identical."""
    name, data = _shard(), wanted[_shard()]
    hub.faults[name] = Fault(truncate=300_000, then_fail=1)
    with pytest.raises(HubError, match=f"^hf://{REPO}: download failed: .*503"):
        resolve_model_dir(f"hf://{REPO}")
    blob = _blob(tmp_path, data)
    part = blob.with_name(blob.name + ".incomplete")
    kept = part.stat().st_size
    assert 0 < kept < len(data) and data.startswith(part.read_bytes())
    assert not blob.exists() and not (blob.parent.parent / "snapshots").exists()
    hub.log.clear()
    path = resolve_model_dir(f"hf://{REPO}")
    assert [r.headers.get("range") for r in hub.gets_of(name)] == [f"bytes={kept}-"]
    assert _files(path) == wanted and not part.exists()


def test_hf_connection_cut_once_is_resumed_within_the_call(hub, wanted):
    """huggingface_hub's own retry: a transfer cut mid-way continues from where it stopped (Range), same call."""
    name = _shard()
    hub.faults[name] = Fault(truncate=300_000)
    path = resolve_model_dir(f"hf://{REPO}")
    ranges = [r.headers.get("range") for r in hub.gets_of(name)]
    assert ranges[0] is None and len(ranges) == 2 and ranges[1].startswith("bytes=")
    assert _files(path) == wanted


def test_hf_checksum_mismatch_is_refused(hub, tmp_path, wanted):
    name, data = _shard(), wanted[_shard()]
    hub.faults[name] = Fault(lie=True)  # same size, other bytes than the announced sha256
    with pytest.raises(HubError, match=f"^hf://{REPO}: {name}: checksum mismatch: the downloaded bytes have "
                                       r"sha256 .* the hub announces .* \(discarded; run again\)$"):
        resolve_model_dir(f"hf://{REPO}")
    blob = _blob(tmp_path, data)
    assert not blob.exists() and not blob.with_name(blob.name + ".incomplete").exists()
    del hub.faults[name]
    assert _files(resolve_model_dir(f"hf://{REPO}")) == wanted


def test_huggingface_hub_alone_checks_sizes_not_checksums(hub, tmp_path, wanted):
    """Why hub.py checks sha256 itself: this huggingface_hub version takes a lying LFS file as it comes. If this
    fails, the library verifies content now and hub.py's own check may be dropped."""
    import huggingface_hub

    name = _shard()
    hub.faults[name] = Fault(lie=True)
    path = huggingface_hub.snapshot_download(REPO, cache_dir=tmp_path / "plain", endpoint=hub.url,
                                             allow_patterns=[name])
    assert (Path(path) / name).read_bytes() != wanted[name]


def test_hf_revision_pinning(hub, tmp_path, ckpt, monkeypatch):
    old_config = json.loads((ckpt / "config.json").read_text()) | {"ggufbridge_test_revision": "v1"}
    files = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}
    v1 = hub.add(REPO, files | {"config.json": json.dumps(old_config).encode()}, refs=("v1",))
    path = resolve_model_dir(f"hf://{REPO}@v1")
    assert path.name == v1 and json.loads((path / "config.json").read_text()) == old_config
    assert hub.requests("GET", f"/api/models/{REPO}/revision/v1")
    assert {r.path.split("/resolve/")[1].split("/")[0] for r in hub.requests(None, "/resolve/")} == {v1}
    # --revision does the same; main is still the newer commit
    assert resolve_model_dir(f"hf://{REPO}", revision="v1") == path
    assert resolve_model_dir(f"hf://{REPO}").name == hub.repos[REPO]["main"].sha != v1
    # offline, a pinned revision and a cached repo id with --revision come from the cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.log.clear()
    assert resolve_model_dir(f"hf://{REPO}@v1") == path
    assert resolve_model_dir(REPO, revision="v1") == path
    assert resolve_model_dir(REPO, revision=v1) == path
    assert not hub.log
    with pytest.raises(CheckpointError, match="no snapshot of that repo id at revision v7"):
        resolve_model_dir(REPO, revision="v7")


def test_hf_token_is_sent(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    resolve_model_dir(f"hf://{REPO}")
    assert {r.headers.get("authorization") for r in hub.log} == {"Bearer hf_test_token"}


# -- ModelScope -----------------------------------------------------------------------------------------------------

def test_ms_download_revision_and_404(hub, tmp_path, wanted, ckpt):
    path = resolve_model_dir(f"ms://{REPO}")
    assert path == tmp_path / "ms" / "models" / REPO.replace("/", "--") / "snapshots" / "master"
    assert _files(path) == wanted
    assert {r.query["FilePath"][0] for r in hub.requests("GET", "/repo") if "FilePath" in r.query} == set(wanted)
    assert ModelDir.open(path).config["architectures"] == ["MiniCPMV4_7ForConditionalGeneration"]

    config = json.loads((ckpt / "config.json").read_text()) | {"ggufbridge_test_revision": "v1"}
    hub.add(REPO, {p.name: p.read_bytes() for p in ckpt.iterdir()} | {"config.json": json.dumps(config).encode()},
            refs=("v1",))
    hub.log.clear()
    pinned = resolve_model_dir(f"ms://{REPO}@v1")
    assert pinned.name == "v1" and json.loads((pinned / "config.json").read_text()) == config
    assert {r.query.get("Revision", [None])[0] for r in hub.log if r.path.startswith(f"/api/v1/models/{REPO}")} \
        == {"v1"}

    with pytest.raises(HubError, match=r"^ms://openbmb/nope: not found \(.*Repository openbmb/nope not found.*"
                                       r"MODELSCOPE_API_TOKEN\)$"):
        resolve_model_dir("ms://openbmb/nope")
    with pytest.raises(HubError, match=f"^ms://{REPO}@v9: not found"):
        resolve_model_dir(f"ms://{REPO}@v9")


def test_ms_interrupted_download_resumes_and_offline_uses_the_cache(hub, tmp_path, wanted, monkeypatch):
    # modelscope retries a failing file with backoff up to 16 s and a failing listing 4 times: once, no wait, here
    monkeypatch.setattr("modelscope_hub._download.DOWNLOAD_RETRY_TIMES", 1)
    monkeypatch.setattr("modelscope_hub._download.DOWNLOAD_RETRY_MAX_DELAY_SECONDS", 0)
    monkeypatch.setattr("modelscope_hub._legacy_api.REPO_TREE_PAGE_MAX_ATTEMPTS", 1)
    name = _shard()
    hub.faults[name] = Fault(truncate=300_000, then_fail=10)
    with pytest.raises(HubError, match=f"^ms://{REPO}: download failed: .*1 of .* failed"):
        resolve_model_dir(f"ms://{REPO}")
    snap = tmp_path / "ms" / "models" / REPO.replace("/", "--") / "snapshots" / "master"
    kept = (snap / f"{name}.incomplete").stat().st_size
    assert 0 < kept < len(wanted[name]) and not (snap / name).exists()
    del hub.faults[name]
    hub.log.clear()
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms_test_token")
    assert _files(resolve_model_dir(f"ms://{REPO}")) == wanted
    assert [r.headers.get("range") for r in hub.gets_of(name)] == [f"bytes={kept}-"]
    assert hub.gets_of(name)[0].headers.get("authorization") == "Bearer ms_test_token"
    # the hub goes away: the snapshot in MODELSCOPE_CACHE still serves
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", f"http://127.0.0.1:{_dead_port()}")
    assert resolve_model_dir(f"ms://{REPO}") == snap


# -- through the CLI and compare ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_convert_from_the_hub(hub, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["convert", f"hf://{REPO}", "-o", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert {f["role"] for f in manifest["files"]} == {"target", "mmproj"}
    assert "pytorch_model.bin" not in manifest["source"] and "README.md" in manifest["source"]


@pytest.mark.slow
def test_cli_in_a_fresh_process(hub, tmp_path):
    """A new interpreter, where nothing imported huggingface_hub or modelscope before: the environment alone points
    them at the hub. Any request for another address goes to a dead proxy instead of the internet."""
    proxy = f"http://127.0.0.1:{_dead_port()}"
    env = os.environ | {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "NO_PROXY": "127.0.0.1,localhost"}

    def convert(*args):
        return subprocess.run([sys.executable, "-m", "ggufbridge", "convert", *args, "--no-progress"], env=env,
                              capture_output=True, text=True, timeout=600)

    res = convert("hf://openbmb/nope", "-o", str(tmp_path / "bad"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == \
        "Error: hf://openbmb/nope: repository not found (a private or gated one needs HF_TOKEN)"
    for spec in (f"hf://{REPO}", f"ms://{REPO}"):
        out = tmp_path / spec[:2]
        res = convert(spec, "-o", str(out), "--no-mmproj")
        assert res.returncode == 0, res.stderr
        assert json.loads((out / "manifest.json").read_text())["files"][0]["role"] == "target"


@pytest.mark.parametrize("args, message", [
    (["hf://openbmb/nope"], "Error: hf://openbmb/nope: repository not found (a private or gated one needs HF_TOKEN)"),
    ([f"hf://{REPO}@v1", "--revision", "v2"], f"Error: hf://{REPO}@v1: names revision v1, but --revision says v2"),
    ([f"hf://{REPO}", "--draft", "hf://openbmb/no-draft"],
     "Error: hf://openbmb/no-draft: repository not found (a private or gated one needs HF_TOKEN)"),
    (["ms://nope"], "Error: ms://nope: expected ms://ORG/NAME[@REVISION]"),
])
def test_cli_convert_hub_errors_are_one_line(hub, tmp_path, args, message):
    res = CliRunner().invoke(cli, ["convert", *args, "-o", str(tmp_path / "out"), "--no-progress"])
    assert res.exit_code == 2
    assert res.output.strip() == message
    assert not (tmp_path / "out").exists()


def test_compare_reference_from_the_hub_is_localized(hub, wanted):
    local = localize(f"hf:hf://{REPO}")
    kind, path = parse_spec(local)
    assert kind == "hf" and _files(path) == wanted
    assert localize(f"hf://{REPO}") == local == f"hf:{path}"


@pytest.mark.slow
def test_dump_logits_and_compare_take_hub_models(hub, tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    out = tmp_path / "ref.safetensors"
    res = CliRunner().invoke(cli, ["dump-logits", "--model", f"hf://{REPO}", "--text", str(text), "--ctx", "16",
                                   "--top-k", "8", "--samples", "0", "--no-floor", "--no-progress", "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["compare", f"hf://{REPO}", "--reference", f"hf:hf://{REPO}", "--text", str(text),
                                   "--ctx", "16", "--no-floor", "--no-progress", "--json", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    cmp = json.loads((tmp_path / "c.json").read_text())
    assert cmp["reference"] == f"hf:hf://{REPO}" and cmp["results"][0]["label"] == REPO.split("/")[1]
    assert cmp["results"][0]["kl_mean"] < 1e-9  # the same checkpoint on both sides


def test_download_progress_is_one_bar_in_bytes(hub, capsys):
    hubmod.download(HubSpec("hf", REPO), progress=True)
    err = capsys.readouterr().err
    assert f"hf://{REPO}:" in err and "B/s" in err
