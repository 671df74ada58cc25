"""Does a peer's release accept what the GPU image has? Its wheel's own Requires-Dist set beside `pip list` of the
image (run.sh writes it as image_pip_list.txt), one verdict per requirement the image already holds at another
version. Where a peer pins a package the image has (LLaMA-Factory: transformers), installing the peer means
replacing the image's copy, and the side-by-side would no longer run every tool on the same transformers: the row
says so instead of running (issue 50: "if its transformers range accepts the image's 5.17").

    pip download --no-deps -d /tmp/lf llamafactory==0.9.5 llamafactory==0.9.4      # here: PyPI is reachable
    python3 bench/peers/requirements_check.py /tmp/lf/*.whl --image bench/results/peers/image_pip_list.txt \
        --out bench/results/peers/llamafactory_requirements.json
"""

from __future__ import annotations

import argparse
import json
import re
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version


def image_versions(pip_list: Path) -> dict[str, str]:
    """`pip list`'s two columns (the header and its dashes skipped)."""
    out = {}
    for line in pip_list.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and re.match(r"^\d", parts[1]):
            out[canonicalize_name(parts[0])] = parts[1]
    return out


def wheel_requirements(wheel: Path) -> tuple[str, str, list[Requirement]]:
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    name = re.search(r"^Name: (.+)$", meta, re.M).group(1).strip()  # type: ignore[union-attr]
    version = re.search(r"^Version: (.+)$", meta, re.M).group(1).strip()  # type: ignore[union-attr]
    reqs = [Requirement(m) for m in re.findall(r"^Requires-Dist: (.+)$", meta, re.M)]
    # Extras' requirements are not installed by a plain install.
    return name, version, [r for r in reqs if not (r.marker and "extra" in str(r.marker))]


def verdict(wheel: Path, image: dict[str, str]) -> dict:
    name, version, reqs = wheel_requirements(wheel)
    conflicts, missing = [], []
    for r in reqs:
        have = image.get(canonicalize_name(r.name))
        if have is None:
            missing.append(str(r))
        elif r.specifier and not r.specifier.contains(Version(have.split("+")[0]), prereleases=True):
            conflicts.append({"requirement": str(r), "image_has": have})
    return {"peer": name, "version": version, "wheel": wheel.name, "conflicts": conflicts,
            "not_on_image": missing, "installable_beside_image": not conflicts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheels", nargs="+", type=Path)
    ap.add_argument("--image", type=Path, required=True, help="`python3 -m pip list` of the GPU image")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    image = image_versions(a.image)
    doc = {"image_pip_list": str(a.image), "image": {k: image.get(k) for k in ("torch", "transformers", "trl",
                                                                              "peft", "accelerate", "datasets")},
           "releases": [verdict(w, image) for w in a.wheels]}
    text = json.dumps(doc, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
