"""A light core (issue 34, item 5): `pip install trio-pipeline` installs what the engine, the SQLite
store, the clients, the CLI and the admin API with its dashboard import, and nothing else; Postgres,
Redis, OpenTelemetry, pydantic and the bundled demo (Pillow, httpx) are extras (pipeline/extras.py).

The wheel is tests/test_wheel.py's build (started as the run begins, early.py). It is installed with
its dependencies alone, as a user's `pip install` would, into a venv made once per run (shared by the
two xdist workers under a lock). Without an extra, asking for what needs it is refused with the
install that gives it (exit status 2), and the bundled demo says how to install it or to pass --app."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import early
import pytest
from test_wheel import WHEEL

pytestmark = pytest.mark.slow

# what the extras install (distribution names, as pip lists them) and their top-level modules
EXTRA_DISTRIBUTIONS = {"pillow", "redis", "psycopg", "psycopg-binary", "psycopg-pool", "opentelemetry-api", "pydantic",
                       "httpx", "httpcore", "uvloop", "django"}
EXTRA_MODULES = ("psycopg", "psycopg_pool", "redis", "PIL", "opentelemetry", "pydantic", "httpx", "httpcore", "uvloop", "django")

APP = '''
import dataclasses
import pathlib
import pipeline

registry = pipeline.Registry()

@dataclasses.dataclass
class WriteNote:
    path: str
    text: str

@registry.job(concurrency=2, timeout=30)
async def write_note(job: WriteNote, ctx: pipeline.JobContext) -> str:
    pathlib.Path(job.path).write_text(job.text)
    return job.text
'''


@pytest.fixture(scope="module")
def core() -> Path:
    """The interpreter of a venv holding the built wheel and its core dependencies alone."""
    built, folder = early.result(WHEEL, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (folder / "dist").glob("trio_pipeline-*.whl")
    venv = early.root() / "light-core-venv"  # one per run: removed with the run's folder
    python = venv / "bin" / "python"
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "ready").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
            done = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            (venv / "ready").write_text(wheel.name)
    return python


def _run(python: Path, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # cwd: a folder of its own, so neither this tree nor its editable install is what gets imported
    return subprocess.run([str(python), *args], cwd=cwd, env={**_clean_env(), **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL", "PIPELINE_APP", "CACHE_URL")}


def test_the_core_installs_no_extra(core: Path, tmp_path: Path) -> None:
    listed = _run(core, "-m", "pip", "list", "--format", "json", cwd=tmp_path)
    installed = {d["name"].lower() for d in json.loads(listed.stdout)}
    assert "trio-pipeline" in installed
    assert installed & EXTRA_DISTRIBUTIONS == set(), listed.stdout
    # and every part of the core imports from it: engine, SQLite store, clients, CLI, admin API and dashboard
    code = ("import pipeline, pipeline.cli, pipeline.client, pipeline.service, pipeline.supervisor, pipeline.testing, "
            "pipeline.admin.server, pipeline.backends.sqlite, pipeline.engine.wiring, pipeline.aio, pipeline.site; "
            "print(pipeline.__file__)")
    where = _run(core, "-c", code, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(core.parent.parent)), where.stdout


def test_import_pipeline_imports_no_extra_where_all_are_installed(tmp_path: Path) -> None:
    """In this suite's venv, where every extra is installed: the core's modules import none of them."""
    code = textwrap.dedent(f"""
        import sys
        import pipeline
        pipeline.open_pipeline, pipeline.Client, pipeline.AsyncClient, pipeline.Registry, pipeline.Config
        import pipeline.cli, pipeline.service, pipeline.supervisor, pipeline.admin.server, pipeline.backends.sqlite
        import pipeline.site  # the bundled demo's types: its handlers' libraries wait for its registry
        print(sorted(m for m in sys.modules if m.partition(".")[0] in {EXTRA_MODULES!r}))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_app_runs_its_jobs_on_sqlite_with_the_cli_and_the_dashboard_from_the_core_alone(core: Path, tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(APP)
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}", "ADMIN_PORT": str(port := _free_port()), "WORKER_PROCESSES": "1"}
    note = tmp_path / "note.txt"
    enqueued = _run(core, "-m", "pipeline", "--app", "myapp:registry", "enqueue", "write_note", "--payload",
                    json.dumps({"path": str(note), "text": "from the core"}), cwd=tmp_path, env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.strip()
    service = subprocess.Popen([str(core), "-m", "pipeline", "--app", "myapp:registry"], cwd=tmp_path,
                               env={**_clean_env(), **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # the job done, and the dashboard served
            listed = _run(core, "-m", "pipeline", "--app", "myapp:registry", "jobs", "--json", "--status", "completed",
                          cwd=tmp_path, env=env)
            assert listed.returncode == 0, listed.stderr
            if job_id in listed.stdout:
                break
            assert service.poll() is None and time.monotonic() < deadline, "the job did not complete"
            time.sleep(0.2)
        assert note.read_text() == "from the core"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin", timeout=10) as page:
            assert "dashboard.js" in page.read().decode()
    finally:
        service.terminate()
        output, _ = service.communicate(timeout=60)
    assert service.returncode == 0, output[-3000:]


def test_the_bundled_demo_without_its_extra_says_how_to_install_it_or_to_pass_app(core: Path, tmp_path: Path) -> None:
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}"}
    default = _run(core, "-m", "pipeline", cwd=tmp_path, env=env)
    assert default.returncode == 2, default.stdout + default.stderr
    assert "needs the demo extra: pip install 'trio-pipeline[demo]'" in default.stderr, default.stderr
    assert "--app MODULE:ATTR" in default.stderr and "Traceback" not in default.stderr
    demo = _run(core, "-m", "pipeline", "demo", "--dir", str(tmp_path / "demo"), cwd=tmp_path, env=env)
    assert demo.returncode == 2, demo.stdout + demo.stderr
    assert "the demo command needs the demo extra: pip install 'trio-pipeline[demo]'" in demo.stderr, demo.stderr
    # its types alone need only the core: the commands on the store work without the extra
    listed = _run(core, "-m", "pipeline", "jobs", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr


@pytest.mark.parametrize(("url", "extra"), [("postgresql://pipeline@127.0.0.1:5432/pipeline", "postgres"),
                                            ("redis://127.0.0.1:6379/0", "redis")])
def test_a_store_without_its_extra_is_refused_naming_the_install(core: Path, tmp_path: Path, url: str, extra: str) -> None:
    (tmp_path / "myapp.py").write_text(APP)
    expected = f"DATABASE_URL={url!r} needs the {extra} extra: pip install 'trio-pipeline[{extra}]'"
    for command in (["jobs"], []):  # a command on the store, and the service
        done = _run(core, "-m", "pipeline", "--app", "myapp:registry", *command, cwd=tmp_path, env={"DATABASE_URL": url})
        assert done.returncode == 2, done.stdout + done.stderr
        assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
    # and from the client an application enqueues with
    code = textwrap.dedent(f"""
        import pipeline, myapp
        try:
            pipeline.Client({url!r}, registry=myapp.registry).enqueue(myapp.WriteNote("note.txt", "x"))
        except pipeline.ConfigError as exc:
            print(exc)
    """)
    client = _run(core, "-c", code, cwd=tmp_path)
    assert client.returncode == 0 and expected in client.stdout, client.stdout + client.stderr


def test_opentelemetry_without_its_extra_is_an_import_error_naming_the_install(core: Path, tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import pipeline, pipeline.otel
        try:
            pipeline.otel.instrument(pipeline.Registry())
        except ImportError as exc:
            print(exc)
    """)
    done = _run(core, "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pipeline.otel.instrument() needs the otel extra: pip install 'trio-pipeline[otel]'" in done.stdout, done.stdout
