"""Checks deploy/k8s/base with what Debian offers (no Kubernetes schema tool is packaged):
every manifest parses as YAML with apiVersion, kind and name; the kustomization lists
them all; the agent DaemonSet shares the host IPC namespace, asks for the GPUs, mounts
the socket folder and the launcher; both daemons mount the TLS Secret, pass the TLS
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
    agent = daemonset["containers"][0]
    check(daemonset.get("hostIPC") is True, "the agents share the host IPC namespace (CUDA IPC)")
    check(agent["resources"]["limits"].get("nvidia.com/gpu", 0) >= 1, "the agent pod asks for the node's GPUs")
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in daemonset["volumes"]}
    check(mounts.get("sockets") == "/run/shardsync" and volumes["sockets"]["hostPath"]["path"] == "/run/shardsync",
          "the sockets live on a hostPath the trainer and rollout pods can mount")
    check(volumes["config"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"],
          "the launcher and node map come from the ConfigMap")
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

    defined = set(config) | {"NODE_NAME", "POD_IP", "index", "i"}
    commands = [config["launch-agents.sh"], " ".join(deployment["spec"]["containers"][0]["args"])]
    used = set(re.findall(r"\$\{?([A-Z_][A-Za-z_]*)\}?", " ".join(commands)))
    check(used <= defined, f"every variable the commands use is defined ({sorted(used - defined) or 'all'})")
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as launcher:
        launcher.write(config["launch-agents.sh"])
        launcher.flush()
        check(subprocess.run(["bash", "-n", launcher.name]).returncode == 0, "the launcher parses (bash -n)")

    # Flags the deployment files pass must be ones the daemons document.
    helps = {d: subprocess.run([path, "--help"], capture_output=True, text=True).stdout
             for d, path in (("shardsync-agent", "daemon/agent/shardsync-agent"),
                             ("shardsync-coordinator", "daemon/coordinator/shardsync-coordinator"))}
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
