// Validates rendered Kubernetes manifests offline, against the official
// schemas and types shipped in the npm package kubernetes-models:
//  1. each object is constructed with its kind's class and validate()d
//     (JSON schema: wrong types, missing required fields, bad enums);
//  2. all objects are written as TypeScript object literals passed to those
//     classes and compiled with tsc --strict, whose excess-property check
//     catches unknown fields (a misspelled imagePullPolicy).
// Custom resources outside the core API (Kubeflow's PyTorchJob) are parsed
// and checked for the fields every object needs, nothing more.
//
// usage: node validate.mjs FILE.yaml...   exit 0 when every object is valid
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
let failures = 0;
const fail = (where, msg) => {
  failures++;
  console.error(`INVALID ${where}: ${msg}`);
};

function modulePath(obj) {
  const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : [null, obj.apiVersion];
  return group ? `kubernetes-models/${group}/${version}/${obj.kind}` : `kubernetes-models/${version}/${obj.kind}`;
}

const typed = [];  // objects for the TypeScript check
for (const file of process.argv.slice(2)) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  for (const doc of docs) {
    if (doc.errors.length) {
      fail(file, doc.errors.map(String).join("; "));
      continue;
    }
    const obj = doc.toJS();
    if (obj == null) continue;
    const where = `${file}: ${obj.kind}/${obj.metadata?.name}`;
    if (!obj.apiVersion || !obj.kind || !obj.metadata?.name) {
      fail(where, "needs apiVersion, kind and metadata.name");
      continue;
    }
    let mod;
    try {
      mod = await import(modulePath(obj));
    } catch {
      if (obj.apiVersion.includes(".") && !obj.apiVersion.endsWith(".k8s.io/v1")) {
        console.log(`ok (custom resource, not schema-checked) ${where}`);
        continue;
      }
      fail(where, `unknown apiVersion/kind ${obj.apiVersion} ${obj.kind}`);
      continue;
    }
    try {
      new mod[obj.kind](obj).validate();
      console.log(`ok ${where}`);
      typed.push({ obj, module: modulePath(obj), where });
    } catch (e) {
      fail(where, e.message);
    }
  }
}

if (typed.length) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pstrain-k8s-"));
  const imports = [...new Set(typed.map((t) => `${t.obj.kind}|${t.module}`))];
  let ts = imports.map((i, n) => {
    const [kind, mod] = i.split("|");
    return `import { ${kind} as K${n} } from "${mod}";`;
  }).join("\n") + "\n";
  typed.forEach((t, n) => {
    const k = imports.findIndex((i) => i === `${t.obj.kind}|${t.module}`);
    const { apiVersion, kind, ...body } = t.obj;  // the class sets these two
    ts += `// ${t.where}\nexport const o${n} = new K${k}(${JSON.stringify(body, null, 2)});\n`;
  });
  const src = path.join(dir, "manifests.ts");
  fs.writeFileSync(src, ts);
  fs.symlinkSync(path.join(here, "node_modules"), path.join(dir, "node_modules"));
  fs.writeFileSync(path.join(dir, "package.json"), '{"type": "module"}');
  try {
    execFileSync(path.join(here, "node_modules/.bin/tsc"),
                 ["--strict", "--noEmit", "--skipLibCheck", "--target", "es2022", "--module", "nodenext",
                  "--moduleResolution", "nodenext", src], { stdio: "pipe" });
    console.log(`ok tsc --strict: ${typed.length} objects`);
  } catch (e) {
    fail("tsc --strict", `\n${e.stdout}${e.stderr}`);
  }
  fs.rmSync(dir, { recursive: true, force: true });
}
if (failures) {
  console.error(`${failures} invalid`);
  process.exit(1);
}
