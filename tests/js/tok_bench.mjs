// tok_bench.mjs — the JavaScript side of `awqd bench tokenizer`: encodes and
// decodes one text file with @huggingface/tokenizers and prints one JSON line
//   {"bytes": N, "ids": K, "checksum": C, "encode_s": S, "decode_s": S, "decoded_ok": true}
// checksum is the same rolling hash of the ids the C side computes, so the
// benchmark also checks that both produced the same ids.
//
// usage: node tests/js/tok_bench.mjs --model DIR --file F
import fs from "node:fs";
import path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? acc.concat([[a.slice(2), all[i + 1]]]) : acc), [])
);
if (!args.model || !args.file) {
  console.error("usage: node tok_bench.mjs --model DIR --file F");
  process.exit(2);
}
const tj = JSON.parse(fs.readFileSync(path.join(args.model, "tokenizer.json"), "utf8"));
let tc = {};
try { tc = JSON.parse(fs.readFileSync(path.join(args.model, "tokenizer_config.json"), "utf8")); } catch { /* optional */ }
const tok = new Tokenizer(tj, tc);
const buf = fs.readFileSync(args.file);
const text = buf.toString("utf8");

tok.encode(text.slice(0, 10000), { add_special_tokens: false }); // warm up the JIT

// CPU seconds of this process (user + system), like the C side's thread CPU time
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };

let t0 = cpu();
const ids = tok.encode(text, { add_special_tokens: false }).ids;
const encode_s = cpu() - t0;

let h = 0;
for (const id of ids) h = (Math.imul(h, 31) + id) >>> 0;

t0 = cpu();
const dec = tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
const decode_s = cpu() - t0;

console.log(JSON.stringify({ bytes: buf.length, ids: ids.length, checksum: h, encode_s, decode_s, decoded_ok: dec === text }));
