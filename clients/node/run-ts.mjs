// Runs one TypeScript file under Node: `node clients/node/run-ts.mjs FILE.ts [ARGS...]`.
// The file is transpiled with this project's `typescript` (types are stripped, not checked)
// into FILE.mjs beside it, which is then imported. Its imports resolve from its own folder, so
// give that folder a node_modules (tests/test_docs_examples.py links clients/node/node_modules).
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import ts from "typescript";

const [source] = process.argv.slice(2);
if (!source || !source.endsWith(".ts")) {
	console.error("usage: node run-ts.mjs FILE.ts");
	process.exit(2);
}
const output = ts.transpileModule(readFileSync(source, "utf8"), {
	fileName: source,
	reportDiagnostics: true,
	compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
});
if (output.diagnostics?.length) {
	for (const diagnostic of output.diagnostics) {
		console.error(ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n"));
	}
	process.exit(2);
}
const target = source.replace(/\.ts$/, ".mjs");
writeFileSync(target, output.outputText);
await import(pathToFileURL(target).href);
