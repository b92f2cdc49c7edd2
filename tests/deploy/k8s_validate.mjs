// Validates every document of the given Kubernetes manifests against the API
// schemas, offline, with npm's kubernetes-models (tests/deploy/k8s_test.sh
// installs it). Exits 1 naming the document and the schema error.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import { Service } from "kubernetes-models/v1";
import { StatefulSet } from "kubernetes-models/apps/v1";
import { Job } from "kubernetes-models/batch/v1";
import { Secret } from "kubernetes-models/v1";

const kinds = { Service, StatefulSet, Job, Secret };
let failed = 0, checked = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    const obj = doc.toJS();
    if (!obj) continue;
    const where = `${file}: ${obj.kind}/${obj.metadata?.name}`;
    const Model = kinds[obj.kind];
    if (!Model) { console.error(`${where}: no schema for kind ${obj.kind}`); failed++; continue; }
    try { new Model(obj).validate(); checked++; console.log(`ok ${where}`); }
    catch (e) { console.error(`${where}: ${e.message}`); failed++; }
  }
}
if (checked === 0) { console.error("no documents"); process.exit(1); }
process.exit(failed ? 1 : 0);
