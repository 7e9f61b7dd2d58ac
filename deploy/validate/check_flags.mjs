// Checks that the rendered manifests match the binaries they run:
//  - every PSTRAIN_* variable a container gets (env and envFrom ConfigMaps)
//    names a flag of that container's binary (PSTRAIN_X sets --x);
//  - gRPC probes use the container's health port, the one the binary
//    serves health on in plaintext (PSTRAIN_HEALTH_PORT), or its gRPC port
//    (PSTRAIN_PORT) when that is plaintext; HTTP probes name a declared port,
//    the metrics port equals PSTRAIN_METRICS_PORT;
//  - every Service's targetPort names a port of the pods it selects, and
//    PSTRAIN_COORDINATOR points at the coordinator Service's gRPC port.
// The flags come from the binaries themselves (--helpfull).
//
// usage: node check_flags.mjs BIN_DIR FILE.yaml...   (BIN_DIR: bazel-bin)
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import YAML from "yaml";

const [binDir, ...files] = process.argv.slice(2);
const binaries = {
  "pstrain-coordinator": "server/coordinator/pstrain-coordinator",
  "pstrain-ps": "server/ps/pstrain-ps",
  "pstrain-worker": "worker/pstrain-worker",
};
const flagsOf = {};
for (const [name, rel] of Object.entries(binaries)) {
  let help = "";
  try {
    help = execFileSync(path.join(binDir, rel), ["--helpfull"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    help = (e.stdout || "") + (e.stderr || "");  // absl exits 1 after --helpfull
  }
  flagsOf[name] = new Set([...help.matchAll(/^\s+--([a-z0-9_]+) /gm)].map((m) => m[1]));
  if (flagsOf[name].size < 3) throw new Error(`could not read the flags of ${rel}`);
}

let failures = 0, checks = 0;
const check = (ok, what) => {
  checks++;
  if (!ok) {
    failures++;
    console.error(`MISMATCH ${what}`);
  }
};

for (const file of files) {
  const objs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8")).map((d) => d.toJS()).filter(Boolean);
  const configMaps = Object.fromEntries(objs.filter((o) => o.kind === "ConfigMap").map((o) => [o.metadata.name, o.data || {}]));
  const workloads = objs.filter((o) => ["Deployment", "StatefulSet"].includes(o.kind));
  for (const w of workloads) {
    for (const c of w.spec.template.spec.containers) {
      const binary = c.command?.[0];
      const where = `${file}: ${w.kind}/${w.metadata.name} ${c.name}`;
      check(binary in flagsOf, `${where}: runs '${binary}', not a pstrain binary`);
      if (!(binary in flagsOf)) continue;
      const env = {};
      for (const from of c.envFrom || []) Object.assign(env, configMaps[from.configMapRef?.name] || {});
      for (const e of c.env || []) {
        const ref = e.valueFrom?.configMapKeyRef;
        env[e.name] = e.value ?? (ref ? configMaps[ref.name]?.[ref.key] : `<from ${JSON.stringify(e.valueFrom)}>`);
      }
      for (const name of Object.keys(env).filter((n) => n.startsWith("PSTRAIN_"))) {
        const flag = name.slice("PSTRAIN_".length).toLowerCase();
        check(flagsOf[binary].has(flag), `${where}: ${name}, but ${binary} has no --${flag}`);
      }
      const ports = Object.fromEntries((c.ports || []).map((p) => [p.name, p.containerPort]));
      const metricsPort = env.PSTRAIN_METRICS_PORT ?? configMaps["pstrain-config"]?.PSTRAIN_METRICS_PORT;
      if (ports.metrics !== undefined) {
        check(String(ports.metrics) === String(metricsPort), `${where}: metrics port ${ports.metrics} but PSTRAIN_METRICS_PORT=${metricsPort}`);
      }
      if (ports.grpc !== undefined) {
        check(String(ports.grpc) === String(env.PSTRAIN_PORT), `${where}: grpc port ${ports.grpc} but PSTRAIN_PORT=${env.PSTRAIN_PORT}`);
      }
      for (const kind of ["livenessProbe", "readinessProbe"]) {
        const probe = c[kind];
        check(probe !== undefined, `${where}: no ${kind}`);
        if (!probe) continue;
        if (probe.grpc) {
          // Kubernetes' gRPC probes speak no TLS: with TLS on, only the
          // plaintext health port can answer them.
          const tls = env.PSTRAIN_TLS_CERT !== undefined;
          const want = tls ? ports.health : ports.grpc;
          check(want !== undefined && probe.grpc.port === want,
                `${where}: ${kind} on port ${probe.grpc.port}, but ${tls ? "TLS is on and health is served in plaintext on" : "gRPC serves"} ${want}`);
          if (tls) check(String(ports.health) === String(env.PSTRAIN_HEALTH_PORT), `${where}: health port ${ports.health} but PSTRAIN_HEALTH_PORT=${env.PSTRAIN_HEALTH_PORT}`);
        }
        if (probe.httpGet) {
          const p = probe.httpGet.port;
          check(typeof p === "string" ? p in ports : Object.values(ports).includes(p), `${where}: ${kind} on undeclared port ${p}`);
          if (probe.httpGet.port === "metrics") check(probe.httpGet.path === "/metrics", `${where}: ${kind} path ${probe.httpGet.path}`);
        }
      }
    }
  }
  for (const svc of objs.filter((o) => o.kind === "Service")) {
    const sel = svc.spec.selector || {};
    const pods = workloads.filter((w) => Object.entries(sel).every(([k, v]) => w.spec.template.metadata.labels?.[k] === v));
    check(pods.length > 0, `${file}: Service/${svc.metadata.name} selects no workload`);
    for (const p of svc.spec.ports) {
      for (const w of pods) {
        const names = w.spec.template.spec.containers.flatMap((c) => (c.ports || []).map((x) => x.name));
        check(names.includes(p.targetPort), `${file}: Service/${svc.metadata.name} targetPort ${p.targetPort} not in ${w.metadata.name}`);
      }
    }
  }
  const coordinator = configMaps["pstrain-config"]?.PSTRAIN_COORDINATOR;
  if (coordinator) {
    const [host, port] = coordinator.split(":");
    const svc = objs.find((o) => o.kind === "Service" && o.metadata.name === host);
    check(svc !== undefined, `${file}: PSTRAIN_COORDINATOR=${coordinator}: no Service ${host}`);
    check(svc?.spec.ports.some((p) => String(p.port) === port && p.name === "grpc"), `${file}: Service ${host} has no grpc port ${port}`);
  }
}
console.log(`${checks} checks, ${failures} mismatches`);
process.exit(failures ? 1 : 0);
