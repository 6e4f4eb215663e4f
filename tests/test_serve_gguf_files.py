"""`ggufbridge serve` on GGUF files as users download them, through the OpenAI API: a folder without a manifest,
single files with --mmproj / --draft (the draft rewritten to upstream llama.cpp's `dspark.*` key convention),
and `hf://ORG/REPO:Q8_0` from a fake hub on 127.0.0.1.

The model is the converted tiny fixture (F32, small vocabulary, random weights): the reference for every way in
is the same files served from the folder `convert` wrote (manifest and all), greedy, so the answers must be equal
token for token; the plan must be the same plan.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import openai
import pytest
from click.testing import CliRunner

from _hub_server import HubServer
from _runtime_models import converted, serve_process
from ggufbridge.cli import cli
from ggufbridge.ggufio.rewrite import rename_keys
from ggufbridge.runtime import locate as loc
from ggufbridge.ggufio.names import DRAFT_KEYS
from _cores import THREADS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSu"
       "QmCC")
HUB_REPO = "openbmb/MiniCPM-V-4_7-tiny-GGUF"
SERVE = ("--recipe", "cpu", "--ctx", "2048", "--threads", str(THREADS))


def _roles(out: Path) -> dict[str, Path]:
    return {f["role"]: out / f["path"] for f in json.loads((out / "manifest.json").read_text())["files"]}


def _ask(url: str, *, image: bool = True, n: int = 12) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    content = [{"type": "text", "text": "Describe this."}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": PNG}})
    r = client.chat.completions.create(model="any", messages=[{"role": "user", "content": content}], max_tokens=n,
                                       temperature=0, seed=0)
    return r.choices[0].message.content, (r.model_extra or {}).get("timings", {})


def _served(model: str | Path, console: Path, *args: str, env: dict | None = None):
    return serve_process(model, console, *SERVE, *args, timeout=180,
                         env=dict(env or os.environ, PYTHONPATH=str(REPO)))


def _answer(model, console, *args, env=None, image=True) -> tuple[str, dict]:
    srv = _served(model, console, *args, env=env)
    try:
        return _ask(srv.url, image=image)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def out(make_ckpt, tmp_path_factory) -> Path:
    return converted(make_ckpt, tmp_path_factory, with_draft=True)


@pytest.fixture(scope="module")
def reference(out, tmp_path_factory) -> dict:
    """The convert folder served as it is: an image chat, and a text chat with the draft."""
    d = tmp_path_factory.mktemp("ref")
    return {"image": _answer(out, d / "image.console")[0],
            "draft": _answer(out, d / "draft.console", "--draft", image=False)[0]}


@pytest.fixture(scope="module")
def upstream_draft(out, tmp_path_factory) -> Path:
    """Our draft with its DSpark values under upstream llama.cpp's `dspark.*` names."""
    d = tmp_path_factory.mktemp("upstream-draft") / "dspark-upstream.gguf"
    rename_keys(_roles(out)["draft"], d, {ours: theirs for ours, theirs in DRAFT_KEYS.values()})
    return d


def test_a_folder_without_a_manifest(out, reference, upstream_draft, tmp_path):
    """Roles from metadata (file names that say nothing), the draft in upstream's key convention."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    roles = _roles(out)
    for role, name in (("target", "a.gguf"), ("mmproj", "b.gguf")):
        os.link(roles[role], folder / name)
    os.link(upstream_draft, folder / "c.gguf")
    assert _answer(folder, tmp_path / "image.console")[0] == reference["image"]
    text, timings = _answer(folder, tmp_path / "draft.console", "--draft", image=False)
    assert text == reference["draft"]  # greedy: drafting must not change the answer...
    assert timings.get("draft_n", 0) > 0  # ...and it did draft, from the renamed-keys copy
    assert _copies_of("c")


def _copies_of(stem: str) -> list[Path]:
    """The renamed-keys copies serve made of draft file `stem` (removed: each test's files are new ones)."""
    found = list((loc.cache_dir() / "drafts").glob(f"{stem}.*.dflash-keys.gguf"))
    for p in found:
        p.unlink()
    return found


def test_single_files(out, reference, upstream_draft, tmp_path):
    roles = _roles(out)
    assert _answer(roles["target"], tmp_path / "image.console", "--mmproj", str(roles["mmproj"]))[0] == \
        reference["image"]
    text, timings = _answer(roles["target"], tmp_path / "draft.console", "--model-draft", str(upstream_draft),
                            image=False)
    assert text == reference["draft"] and timings.get("draft_n", 0) > 0
    assert _copies_of(upstream_draft.stem)


def test_plan_is_the_same_from_every_way_in(out, upstream_draft, tmp_path):
    roles = _roles(out)

    def plan(*args):
        res = CliRunner().invoke(cli, ["plan", *args, "--recipe", "spark", "--json"])
        assert res.exit_code == 0, res.output
        planned = json.loads(res.stdout)
        planned.pop("here")  # this machine now: its free memory moves between two calls
        return planned

    ref = plan(str(out), "--draft")
    assert ref["figures"]["draft_weights"] > 0 and ref["figures"]["mmproj"] > 0
    assert plan(str(roles["target"]), "--mmproj", str(roles["mmproj"]), "--model-draft", str(upstream_draft)) == ref
    # a single file picks up the projector beside it, as its folder would
    assert plan(str(roles["target"]))["figures"]["mmproj"] == ref["figures"]["mmproj"]


def test_a_draft_that_does_not_fit_is_refused(out, tmp_path, make_ckpt, tmp_path_factory):
    """The same coupling checks as convert's: a draft for another target (here: the ablation of one rule, its target
    layers outside the target) is one line, exit 2, before any server starts."""
    roles = _roles(out)
    bad = tmp_path / "bad-draft.gguf"
    rename_keys(roles["draft"], bad, {})  # a copy
    from gguf import GGUFReader

    r = GGUFReader(bad, "r+")
    r.fields["dflash.target_layers"].parts[-1][...] = 99  # memmapped: edits the file in place
    del r
    res = CliRunner().invoke(cli, ["serve", str(roles["target"]), "--model-draft", str(bad), "--dry-run"])
    assert res.exit_code == 2 and "target layers must lie in [1," in res.stderr and "Traceback" not in res.output


@pytest.fixture
def hub(out, make_ckpt, tmp_path_factory, tmp_path):
    """A fake Hugging Face on 127.0.0.1 holding a GGUF repo as people publish them: two quants, two projectors,
    a model card."""
    from ggufbridge.convert import convert

    q8 = tmp_path_factory.mktemp("q8")
    convert(make_ckpt("tiny", vocab="small"), q8 / "out", outtype="q8_0", mmproj=False, progress=False)
    roles = _roles(out)
    with HubServer() as fake:
        fake.add(HUB_REPO, {
            "README.md": b"# tiny\n",
            "MiniCPM-V-4_7-tiny-Q8_0.gguf": _roles(q8 / "out")["target"].read_bytes(),
            "MiniCPM-V-4_7-tiny-F32.gguf": roles["target"].read_bytes(),
            "mmproj-MiniCPM-V-4_7-tiny-F16.gguf": roles["mmproj"].read_bytes(),
            "mmproj-MiniCPM-V-4_7-tiny-F32.gguf": roles["mmproj"].read_bytes()[:100],  # not this one: F16 first
        })
        yield fake


def test_hub_spec(hub, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    proxy = f"http://127.0.0.1:{dead}"  # anything not on loopback goes nowhere
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_CACHE=str(tmp_path / "hf"),
               HF_HUB_DISABLE_TELEMETRY="1", HTTP_PROXY=proxy, HTTPS_PROXY=proxy, NO_PROXY="127.0.0.1,localhost")
    for k in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        env.pop(k, None)
    spec = f"hf://{HUB_REPO}:Q8_0"
    srv = _served(spec, tmp_path / "hub.console", env=env)
    try:
        text, _ = _ask(srv.url)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["MiniCPM-V-4_7-tiny-Q8_0"]
    finally:
        srv.stop()
    assert text
    assert hub.gets_of("MiniCPM-V-4_7-tiny-Q8_0.gguf") and hub.gets_of("mmproj-MiniCPM-V-4_7-tiny-F16.gguf")
    assert not hub.gets_of("MiniCPM-V-4_7-tiny-F32.gguf") and not hub.gets_of("mmproj-MiniCPM-V-4_7-tiny-F32.gguf")
    # the second time: from the cache, even offline
    res = CliRunner().invoke(cli, ["plan", spec, "--json"], env={**env, "HF_HUB_OFFLINE": "1"})
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["plan", f"hf://{HUB_REPO}:Q5_K_M"], env=env)
    assert res.exit_code == 2 and "no GGUF file for Q5_K_M" in res.stderr
    shutil.rmtree(tmp_path / "hf", ignore_errors=True)


def _as_upstream_mmproj(ours: Path, dest: Path) -> Path:
    """Our mmproj in upstream llama.cpp's convention: projector `minicpmv4_7`, none of our clip.minicpmv.* keys
    (renamed out of the runtime's sight), upstream's clip.vision.max_slice_nums and scale_factor kept."""
    from gguf import GGUFReader

    ours_keys = [f.name for f in GGUFReader(ours).fields.values() if f.name.startswith("clip.minicpmv.")]
    rename_keys(ours, dest, {k: "ours-dropped." + k for k in ours_keys})
    r = GGUFReader(dest, "r+")
    value = r.fields["clip.projector_type"].parts[-1]
    assert bytes(value) == b"minicpmv4_6"
    value[:] = np.frombuffer(b"minicpmv4_7", dtype=np.uint8)  # same length: edited in place
    del r
    return dest


def test_an_upstream_projector_loads_where_the_runtime_knows_it(out, reference, tmp_path):
    roles = _roles(out)
    up = _as_upstream_mmproj(roles["mmproj"], tmp_path / "mmproj-upstream.gguf")
    if not loc.locate().has_string("minicpmv4_7"):
        res = CliRunner().invoke(cli, ["serve", str(roles["target"]), "--mmproj", str(up), "--port", "1"])
        assert res.exit_code == 2 and "does not know projector 'minicpmv4_7'" in res.stderr
        assert res.stderr.count("\n") == 1
        return
    console = tmp_path / "upstream.console"
    assert _answer(roles["target"], console, "--mmproj", str(up))[0] == reference["image"]
    assert "warning: images" not in console.read_text()
