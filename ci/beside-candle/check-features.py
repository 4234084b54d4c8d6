"""ci/beside-candle stands in for a user's crate with graph-runtime and candle-core `cuda`
without compiling candle a second time (see its Cargo.toml). Run by scripts/candle-tier.sh
from the repository root, this checks that the stand-in is exact:

1. its cudarc dependency is candle-core's, as declared by the candle-core in the workspace's
   Cargo.lock (the same features, default features off), resolved to the same cudarc version;
2. the workspace's candle tier builds cudarc with exactly graph-runtime's features plus
   candle-core's (and what they imply), nothing more from other members, so the candle-core
   it compiles and links with graph-runtime is the one a user's crate gets.
"""
import json
import subprocess
import sys


def metadata(*args):
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked", *args]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"check-features: `{' '.join(cmd)}` failed:\n{run.stderr}")
    return json.loads(run.stdout)


def package(meta, name):
    found = [p for p in meta["packages"] if p["name"] == name]
    if len(found) != 1:
        sys.exit(f"check-features: expected one {name} in the lock, found {len(found)}")
    return found[0]


def cudarc_dep(pkg):
    [dep] = [d for d in pkg["dependencies"] if d["name"] == "cudarc" and d["kind"] is None]
    return dep


def implied(cudarc, features):
    """The features cudarc turns on from `features`, its own feature table followed."""
    table = cudarc["features"]
    on, todo = set(), list(features)
    while todo:
        f = todo.pop()
        if f in on:
            continue
        on.add(f)
        todo += [g for g in table.get(f, []) if not g.startswith("dep:") and "/" not in g]
    return on


ws = metadata("--features", "cuda-graphs/candle")
beside = metadata("--manifest-path", "ci/beside-candle/Cargo.toml")
candle = package(ws, "candle-core")
want = cudarc_dep(candle)
got = cudarc_dep(package(beside, "beside-candle"))
failed = False
for key in ("features", "uses_default_features", "req"):
    a, b = want[key], got[key]
    if key == "features":
        a, b = sorted(a), sorted(b)
    if a != b:
        failed = True
        print(f"check-features: ci/beside-candle's cudarc {key} is {b}, "
              f"candle-core {candle['version']}'s is {a}", file=sys.stderr)
ws_cudarc, beside_cudarc = package(ws, "cudarc"), package(beside, "cudarc")
if ws_cudarc["version"] != beside_cudarc["version"]:
    failed = True
    print(f"check-features: ci/beside-candle/Cargo.lock has cudarc {beside_cudarc['version']}, "
          f"the workspace's {ws_cudarc['version']}", file=sys.stderr)

runtime = package(ws, "graph-runtime")
union = implied(ws_cudarc, cudarc_dep(runtime)["features"] + want["features"])
[node] = [n for n in ws["resolve"]["nodes"] if n["id"] == ws_cudarc["id"]]
built = set(node["features"])
if built != union:
    failed = True
    print(f"check-features: the workspace's candle tier builds cudarc with {sorted(built)}, "
          f"not graph-runtime's and candle-core's alone ({sorted(union)}): extra "
          f"{sorted(built - union)}, missing {sorted(union - built)}", file=sys.stderr)
if failed:
    sys.exit(1)
print(f"check-features: ci/beside-candle asks cudarc {ws_cudarc['version']} for candle-core "
      f"{candle['version']}'s features; the workspace tier builds cudarc with graph-runtime's "
      f"and candle-core's: {' '.join(sorted(built))}")
