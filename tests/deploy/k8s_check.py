"""Checks deploy/k8s/base with what Debian offers (no Kubernetes schema tool is packaged):
every manifest parses as YAML with apiVersion, kind and name; the kustomization lists
them all; the agent DaemonSet shares the host IPC namespace, sees the node's GPUs
through the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES=all) without requesting or limiting
any nvidia.com/ resource (those GPUs belong to the trainer and rollout pods), mounts the
socket folder and the launcher; the launcher counts the node's GPUs instead of taking a
fixed number, and, run with a fake nvidia-smi and a fake agent on PATH, starts one agent
per GPU with ranks node index x GPUS_PER_NODE + GPU index, and refuses to start on a node
with no GPU or with more than GPUS_PER_NODE; both daemons mount the TLS Secret, pass the TLS
flags and probe the plaintext metrics port (kubelet has no client certificate for the
mutual-TLS gRPC port); the coordinator's Service
selects its pods and names real container ports; every variable the commands use is
defined; the launcher passes `bash -n`; and every flag any manifest or systemd unit
passes to a daemon is one the daemon's --help documents."""

import os
import re
import subprocess
import sys
import tempfile

import yaml

BASE = "deploy/k8s/base"
FAILURES = []


def check(condition, what):
    print(("ok: " if condition else "FAIL: ") + what)
    if not condition:
        FAILURES.append(what)


# Stands in for nvidia-smi on a node with $FAKE_GPUS GPUs, for the two ways of listing them.
FAKE_NVIDIA_SMI = """#!/bin/sh
if [ "$FAKE_GPUS" -eq 0 ]; then echo "No devices were found"; exit 6; fi
i=0
while [ "$i" -lt "$FAKE_GPUS" ]; do
  case "$*" in
    "--query-gpu=index --format=csv,noheader") echo "$i" ;;
    "-L") echo "GPU $i: NVIDIA H200 (UUID: GPU-0000000$i)" ;;
    *) echo "fake nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
  esac
  i=$((i + 1))
done
"""
# Stands in for the agent: writes its arguments, one a line, and exits.
FAKE_AGENT = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_DIR/agent.$$"
"""


# The launcher's folders are the host's /run/shardsync: made by nobody here.
FAKE_MKDIR = "#!/bin/sh\nexit 0\n"


def run_launcher(launcher, config, node, gpus, gpus_per_node):
    """Runs the launcher as the pod would, with fakes first on PATH; returns (exit status,
    stderr, one {flag: value} per agent started)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (("nvidia-smi", FAKE_NVIDIA_SMI), ("shardsync-agent", FAKE_AGENT), ("mkdir", FAKE_MKDIR),
                           ("launch-agents.sh", launcher), ("node-index", config["node-index"])):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(tmp, name), 0o755)
        env = {k: str(v) for k, v in config.items() if re.fullmatch(r"[A-Z_][A-Z0-9_]*", k)}
        env.update(GPUS_PER_NODE=str(gpus_per_node), NODE_NAME=node, POD_IP="10.0.0.7",
                   PATH=tmp + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
                   SHARDSYNC_NODE_INDEX=os.path.join(tmp, "node-index"),
                   FAKE_GPUS=str(gpus), FAKE_DIR=tmp)
        # The agents inherit the launcher's pipes: this returns once they have all exited.
        run = subprocess.run(["bash", os.path.join(tmp, "launch-agents.sh")], env=env,
                             capture_output=True, text=True, timeout=60)
        agents = []
        for name in sorted(os.listdir(tmp)):
            if name.startswith("agent."):
                args = open(os.path.join(tmp, name)).read().split("\n")
                agents.append({a: b for a, b in zip(args, args[1:]) if a.startswith("--")})
        return run.returncode, run.stderr, agents


def main():
    kustomization = yaml.safe_load(open(os.path.join(BASE, "kustomization.yaml")))
    docs = {}
    for name in kustomization["resources"]:
        doc = yaml.safe_load(open(os.path.join(BASE, name)))
        check(all(k in doc for k in ("apiVersion", "kind", "metadata")) and doc["metadata"].get("name"),
              f"{name} has apiVersion, kind and a name")
        docs[doc["kind"]] = doc
    listed = set(kustomization["resources"])
    on_disk = {f for f in os.listdir(BASE) if f.endswith(".yaml") and f != "kustomization.yaml"}
    check(listed == on_disk, "the kustomization lists every manifest")
    check(set(docs) == {"Namespace", "ConfigMap", "Deployment", "Service", "DaemonSet"}, "the five kinds are there")

    config = docs["ConfigMap"]["data"]
    daemonset = docs["DaemonSet"]["spec"]["template"]["spec"]
    agent = next((c for c in daemonset["containers"] if c["name"] == "agents"), daemonset["containers"][0])
    check(daemonset.get("hostIPC") is True, "the agents share the host IPC namespace (CUDA IPC)")
    # The device plugin hands a node's GPUs to the pods that ask for them: an agent pod that
    # asked would take them from the trainer and rollout pods.
    claims = [f"{c['name']}: {part} {key}"
              for c in daemonset["containers"] + daemonset.get("initContainers", []) + [{"name": "pod", **daemonset}]
              for part in ("limits", "requests")
              for key in ((c.get("resources") or {}).get(part) or {}) if key.startswith("nvidia.com/")]
    check(not claims, f"the agent DaemonSet neither requests nor limits nvidia.com/gpu ({claims or 'none'})")
    env = {e["name"]: e.get("value") for e in agent.get("env", [])}
    check(env.get("NVIDIA_VISIBLE_DEVICES") == "all",
          "the agents container sees every GPU of the node (NVIDIA_VISIBLE_DEVICES=all)")
    capabilities = set((env.get("NVIDIA_DRIVER_CAPABILITIES") or "").split(","))
    check("all" in capabilities or {"compute", "utility"} <= capabilities,
          "NVIDIA_DRIVER_CAPABILITIES gives the agents CUDA (compute) and nvidia-smi (utility)")
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in daemonset["volumes"]}
    check(mounts.get("sockets") == "/run/shardsync" and volumes["sockets"]["hostPath"]["path"] == "/run/shardsync",
          "the sockets live on a hostPath the trainer and rollout pods can mount")
    check(volumes["config"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"],
          "the launcher and node map come from the ConfigMap")
    check(docs["Deployment"]["spec"].get("strategy", {}).get("type") == "Recreate",
          "the coordinator's Deployment never runs two coordinators (strategy Recreate)")
    rollout = docs["DaemonSet"]["spec"].get("updateStrategy", {})
    check(rollout.get("type") == "RollingUpdate" and rollout.get("rollingUpdate", {}).get("maxUnavailable") == "100%",
          "a new agent image replaces every node's agents at once (maxUnavailable 100%)")
    coordinator_pod = docs["Deployment"]["spec"]["template"]["spec"]
    for kind, pod in (("DaemonSet", daemonset), ("Deployment", coordinator_pod)):
        container = pod["containers"][0]
        metrics_ports = {p["containerPort"] for p in container["ports"] if p["name"].startswith("metrics")}
        for probe in ("livenessProbe", "readinessProbe"):
            get = container.get(probe, {}).get("httpGet", {})
            check(get.get("path") == "/metrics" and get.get("port") in metrics_ports,
                  f"{kind}: {probe} reads /metrics on a container port")
        tls_mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/etc/shardsync-tls"]
        secrets = {v["name"]: v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])}
        check(len(tls_mounts) == 1 and secrets.get(tls_mounts[0]["name"]) == "shardsync-tls",
              f"{kind}: mounts the TLS Secret shardsync-tls")
    for text in (config["launch-agents.sh"], " ".join(coordinator_pod["containers"][0]["args"])):
        check(all(flag in text for flag in ("--tls-ca", "--tls-cert", "--tls-key")) and "--insecure" not in text,
              "the daemons run with mutual TLS, never --insecure")
    deployment = docs["Deployment"]["spec"]["template"]
    service = docs["Service"]["spec"]
    check(all(deployment["metadata"]["labels"].get(k) == v for k, v in service["selector"].items()),
          "the Service selects the coordinator's pods")
    port_names = {p["name"] for p in deployment["spec"]["containers"][0]["ports"]}
    check(all(p["targetPort"] in port_names for p in service["ports"]), "the Service targets named container ports")

    commands = [config["launch-agents.sh"], " ".join(deployment["spec"]["containers"][0]["args"])]
    # ${NAME:-default} defines NAME where it is used.
    defaults = set(re.findall(r"\$\{([A-Z_][A-Za-z_]*):-", " ".join(commands)))
    defined = set(config) | {"NODE_NAME", "POD_IP"} | defaults
    used = set(re.findall(r"\$\{?([A-Z_][A-Za-z_]*)\}?", " ".join(commands)))
    check(used <= defined, f"every variable the commands use is defined ({sorted(used - defined) or 'all'})")
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as launcher:
        launcher.write(config["launch-agents.sh"])
        launcher.flush()
        check(subprocess.run(["bash", "-n", launcher.name]).returncode == 0, "the launcher parses (bash -n)")

    # The agent count follows the node's GPUs; GPUS_PER_NODE is only the rank stride.
    script = config["launch-agents.sh"]
    check("nvidia-smi" in script, "the launcher counts the node's GPUs (nvidia-smi)")
    loops = [line.strip() for line in script.splitlines() if re.match(r"\s*(while|until|for)\b", line)]
    check(loops and not [l for l in loops if "GPUS_PER_NODE" in l or re.search(r"(?<![$\w])\d+\b", l)],
          f"the launcher's agent loop runs to the GPU count, not GPUS_PER_NODE or a number ({loops})")
    stride = int(config["GPUS_PER_NODE"])
    node, index = config["node-index"].split()[-1].split("=")
    index = int(index)
    probed = agent["livenessProbe"]["httpGet"]["port"]
    status, err, agents = run_launcher(script, config, node, 2, stride)
    check(sorted((int(a.get("--rank", -1)), a.get("--device")) for a in agents)
          == [(index * stride, "0"), (index * stride + 1, "1")],
          f"on a node with 2 GPUs the launcher starts 2 agents, ranks {index}x{stride}+0 and +1 on devices 0 and 1 "
          f"({[(a.get('--rank'), a.get('--device')) for a in agents]})")
    check(sorted(a.get("--socket", "") for a in agents)
          == ["/run/shardsync/agent-0/agent.sock", "/run/shardsync/agent-1/agent.sock"],
          "each agent's socket is agent-<gpu>/agent.sock")
    check([a.get("--metrics-listen") for a in agents if a.get("--device") == "0"] == [f"0.0.0.0:{probed}"],
          "GPU 0's agent serves the metrics port the probes read")
    check(agents and status != 0, "the launcher exits non-zero when an agent does (the pod restarts as a whole)")
    status, err, agents = run_launcher(script, config, node, 0, stride)
    check(status != 0 and not agents and "no GPU" in err,
          f"on a node with no GPU the launcher starts nothing and exits non-zero, saying so ({err.strip()!r})")
    status, err, agents = run_launcher(script, config, node, stride + 1, stride)
    check(status != 0 and not agents and "GPUS_PER_NODE" in err,
          f"on a node with more GPUs than GPUS_PER_NODE the launcher refuses (ranks would collide) ({err.strip()!r})")

    # Flags the deployment files pass must be ones the daemons document.
    # Under bazel test they lie in the runfiles (the working directory); run by hand from
    # the repository root, in bazel-bin.
    helps = {}
    for daemon, path in (("shardsync-agent", "daemon/agent/shardsync-agent"),
                         ("shardsync-coordinator", "daemon/coordinator/shardsync-coordinator")):
        found = next((p for p in (path, os.path.join("bazel-bin", path)) if os.access(p, os.X_OK)), None)
        check(found is not None, f"{daemon} is built ({path}, or bazel-bin/{path})")
        helps[daemon] = subprocess.run([found, "--help"], capture_output=True, text=True).stdout if found else ""
    texts = commands + [open(os.path.join("deploy/systemd", f)).read() for f in os.listdir("deploy/systemd")
                        if f.endswith(".service")]
    for text in texts:
        for daemon, flags in re.findall(r"(shardsync-agent|shardsync-coordinator)\b(.*?)(?:&|$|\n\n)", text, re.S):
            for flag in set(re.findall(r"(--[a-z-]+)", flags)):
                check(flag in helps[daemon], f"{daemon} documents {flag}")
    print(f"{len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
