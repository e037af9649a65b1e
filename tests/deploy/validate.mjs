// Validates Kubernetes documents (YAML, several per file) against the schemas
// of the kubernetes-models packages (Kubernetes, KEDA, Prometheus Operator):
// types, required fields, enums and formats. Every document must map to a
// model; an unknown apiVersion/kind is an error, never a pass.
//   node validate.mjs FILE...   one JSON line per document; exit 1 if any is invalid
import { readFileSync } from 'node:fs';
import { parseAllDocuments } from 'yaml';

const packages = {
  'keda.sh': '@kubernetes-models/keda',
  'monitoring.coreos.com': '@kubernetes-models/prometheus-operator',
};

async function model(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const pkg = packages[group] || 'kubernetes-models';
  const path = [pkg, group, version, kind].filter(Boolean).join('/');
  try {
    return (await import(path))[kind];
  } catch (e) {
    throw new Error(`no schema for ${apiVersion} ${kind} (${path}): ${e.message}`);
  }
}

let bad = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(file, 'utf8'))) {
    if (doc.errors.length) { bad++; console.log(JSON.stringify({ file, ok: false, error: doc.errors[0].message })); continue; }
    const obj = doc.toJS();
    if (!obj) continue;
    const row = { file, kind: obj.kind, name: obj.metadata && obj.metadata.name };
    try {
      const M = await model(obj.apiVersion, obj.kind);
      new M(obj).validate();
      row.ok = true;
    } catch (e) {
      bad++;
      row.ok = false;
      row.error = e.message;
    }
    console.log(JSON.stringify(row));
  }
}
process.exit(bad ? 1 : 0);
