"""``make chart``: lint ``charts/pdserve`` and print what it renders, like ``helm lint`` + ``helm template``,
without a helm binary (helm-python-sdk runs Helm's engine in-process, offline).

    python charts/render.py                                       # default values (CPU demo)
    python charts/render.py -f charts/pdserve/ci/production-values.yaml --name llm --namespace serving
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parent / "pdserve"
SEVERITIES = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}


def deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        both_maps = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = deep_merge(merged[key], value) if both_maps else value
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-f", "--values", type=Path, action="append", default=[], help="values file (repeatable)")
    parser.add_argument("--name", default="pdserve", help="release name")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--kube-version", default="v1.27.0", help="Kubernetes version helm lint assumes")
    args = parser.parse_args(argv)
    values: dict = {}
    for path in args.values:  # later files win, key by key (as helm -f does)
        values = deep_merge(values, yaml.safe_load(path.read_text()) or {})
    report = helm.lint(CHART, values or None, strict=True, namespace=args.namespace, kube_version=args.kube_version)
    for message in report["messages"]:
        print(f"# lint {SEVERITIES.get(message['severity'], '?')} {message['path']}: {message['error'].strip()}",
              file=sys.stderr)
    if report["errors"] or any(m["severity"] >= 2 for m in report["messages"]):
        return 1
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or None, name=args.name, namespace=args.namespace)
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml") and text.strip():
            print(f"---\n# Source: {path}\n{text.strip().removeprefix('---').strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
