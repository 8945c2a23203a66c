#!/usr/bin/env bash
# Static checks of the deployment files (no container runtime, no cluster
# needed): deploy/k8s/skiff.yaml parses and holds the Namespace, the
# ConfigMap whose TOML parses and has a [mesh] table, the headless Service
# (clusterIP None, publishNotReadyAddresses, UDP 4748) and the DaemonSet
# (hostNetwork, port 4747, probes, resources); every COPY source of
# deploy/Dockerfile exists. Prints one line; exits non-zero on failure.
# Installs python3-yaml (apt) if no python3 here can import yaml.
set -euo pipefail
cd "$(dirname "$0")/.."

py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import yaml, tomllib' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q python3-yaml >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q python3-yaml >/dev/null; }
    py=/usr/bin/python3
  else
    echo "deploy/check.sh: needs python3 with yaml (apt-get install python3-yaml)" >&2
    exit 1
  fi
fi

"$py" - <<'PY'
import os, re, sys, tomllib, yaml

errors = []
def need(ok, what):
    if not ok:
        errors.append(what)

docs = [d for d in yaml.safe_load_all(open("deploy/k8s/skiff.yaml")) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d.get("kind"), []).append(d)
for kind in ("Namespace", "ConfigMap", "Service", "DaemonSet"):
    need(kind in by_kind, f"no {kind}")

for cm in by_kind.get("ConfigMap", []):
    text = cm.get("data", {}).get("skiff.toml")
    need(text is not None, "ConfigMap has no skiff.toml")
    if text is not None:
        cfg = tomllib.loads(text)
        need("mesh" in cfg, "skiff.toml has no [mesh] table")
        need(set(cfg.get("mesh", {})) <= {"bind", "net", "seeds", "seeds_dns", "scout",
             "max_members", "max_interest", "interest_rate", "max_datagram"}, "unknown [mesh] key")

svc = [s for s in by_kind.get("Service", []) if s["spec"].get("clusterIP") == "None"]
need(svc, "no headless Service (clusterIP: None)")
for s in svc:
    need(s["spec"].get("publishNotReadyAddresses") is True, "headless Service without publishNotReadyAddresses")
    need(any(p.get("protocol") == "UDP" and p.get("port") == 4748 for p in s["spec"]["ports"]),
         "headless Service without UDP 4748")

for ds in by_kind.get("DaemonSet", []):
    pod = ds["spec"]["template"]["spec"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    need(ds["spec"]["selector"]["matchLabels"].items() <= labels.items(), "DaemonSet selector does not match its pods")
    for s in svc:
        need(s["spec"]["selector"].items() <= labels.items(), "headless Service selects no DaemonSet pod")
    need(pod.get("hostNetwork") is True, "DaemonSet without hostNetwork")
    need(pod.get("dnsPolicy") == "ClusterFirstWithHostNet", "hostNetwork without dnsPolicy ClusterFirstWithHostNet")
    c = pod["containers"][0]
    need(any(p.get("containerPort") == 4747 for p in c.get("ports", [])), "no client port 4747")
    for k in ("readinessProbe", "livenessProbe", "resources"):
        need(k in c, f"container without {k}")
    env = {e["name"]: e for e in c.get("env", [])}
    need("SKIFF_MESH" in env, "no SKIFF_MESH")
    defined = set()
    for e in c.get("env", []):
        for ref in re.findall(r"\$\((\w+)\)", e.get("value", "")):
            need(ref in defined, f"{e['name']} refers to $({ref}) before it is defined")
        defined.add(e["name"])
    mounts = {m["name"] for m in c.get("volumeMounts", [])}
    need(mounts <= {v["name"] for v in pod.get("volumes", [])}, "volumeMount without a volume")

# Dockerfile: every COPY source (outside --from stages) exists.
for line in open("deploy/Dockerfile"):
    words = line.split()
    if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
        for src in words[1:-1]:
            need(os.path.exists(src), f"Dockerfile copies {src}, which does not exist")

if errors:
    print("deploy/check.sh: FAILED: " + "; ".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"deploy: {len(docs)} Kubernetes objects and the Dockerfile check out")
PY
