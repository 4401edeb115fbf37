"""pycni as a user gets it: the wheel built from this checkout, installed into a fresh venv outside
the tree, its dependencies from a local wheelhouse (build/wheelhouse, filled from the package
index on first use for each interpreter, so later runs need no network).

PYCNI_WHEEL_PYTHON names the interpreter the venv is made with; by default the one this venv was
made from (`.ci/run` points it at pyenv's 3.12 and 3.13)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / "build" / "wheelhouse"
PYTHON_ENV = "PYCNI_WHEEL_PYTHON"
TIMEOUT = 600


def base_python() -> Path:
    """The interpreter to make the venv with: $PYCNI_WHEEL_PYTHON, else this venv's base."""
    if env := os.environ.get(PYTHON_ENV):
        return Path(env)
    return Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def build(outdir: Path, src: Path = ROOT) -> tuple[Path, Path]:
    """`python -m build`: the sdist, then the wheel from that sdist (so the sdist must be
    complete). No isolation: the dev venv has setuptools and build, and no network is needed."""
    outdir.mkdir(parents=True, exist_ok=True)
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", outdir, src, cwd=outdir)
    sdists, wheels = sorted(outdir.glob("pycni-*.tar.gz")), sorted(outdir.glob("pycni-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(outdir.iterdir())
    return sdists[0], wheels[0]


def build_wheel(outdir: Path, src: Path) -> Path:
    """The wheel of another project (examples/...): `python -m build --wheel`, no isolation."""
    outdir.mkdir(parents=True, exist_ok=True)
    _run(sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", outdir, src,
         cwd=outdir)
    [wheel] = sorted(outdir.glob("*.whl"))
    return wheel


def requirements(src: Path = ROOT) -> list[str]:
    """The project's runtime dependencies, as pyproject.toml names them."""
    return list(tomllib.loads((src / "pyproject.toml").read_text())["project"]["dependencies"])


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode()


@dataclass
class Venv:
    """A venv with pycni installed from its wheel."""

    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def pycni(self) -> Path:
        return self.path / "bin" / "pycni"

    def site_packages(self) -> Path:
        code = "import sysconfig; print(sysconfig.get_path('purelib'))"
        out = _run(self.python, "-I", "-c", code, cwd=self.path)
        return Path(out.strip())

    def run(self, *args: str | Path, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> str:
        """A command of this venv's (python, pycni, pip), away from the checkout."""
        return _run(*args, cwd=cwd or self.path, env=env)

    def install(self, wheel: Path, *, wheelhouse: Path = WHEELHOUSE) -> None:
        """pip install the wheel, its dependencies from the wheelhouse only (filled first from the
        index if it lacks them for this interpreter)."""
        pip = (self.python, "-m", "pip", "install", "-q", "--disable-pip-version-check")
        offline = (*pip, "--no-index", "--find-links", wheelhouse)
        try:
            self.run(*offline, wheel)
            return
        except AssertionError:
            pass
        wheelhouse.mkdir(parents=True, exist_ok=True)
        self.run(self.python, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                 "-d", wheelhouse, *requirements())
        self.run(*offline, wheel)


def make_venv(dest: Path, wheel: Path, python: Path | None = None) -> Venv:
    """A fresh venv at dest made with `python` (default base_python()), pycni installed."""
    python = python or base_python()
    if not python.is_file():
        raise AssertionError(f"no interpreter {python} ({PYTHON_ENV})")
    _run(python, "-m", "venv", dest, cwd=dest.parent)
    venv = Venv(dest)
    venv.install(wheel)
    return venv


def example_venv(tmp_path_factory, example: Path, wheel_prefix: str) -> Venv:
    """pycni's wheel and an example plugin's (examples/<name>, built from a copy: setuptools
    leaves build/ and egg-info in the source) installed in a fresh venv."""
    import shutil

    dist = tmp_path_factory.mktemp("dist")
    _, pycni_wheel = build(dist / "pycni")
    src = dist / "example-src"
    shutil.copytree(example, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    example_wheel = build_wheel(dist / "example", src)
    assert example_wheel.name.startswith(wheel_prefix), example_wheel
    venv = make_venv(tmp_path_factory.mktemp("plugin-venv") / "venv", pycni_wheel)
    venv.install(example_wheel)
    return venv
