// openai_client.mjs — the official `openai` npm client, unmodified, against a
// running awqd (run by tests/test_server.c: server.openai_node_client).
//
//   node tests/js/openai_client.mjs BASE_URL MODEL [API_KEY]
//
// Checks completions.create with and without stream, n: 2, logprobs: 3, echo,
// stop, seed, and that errors come back as the client's typed errors.
import OpenAI from 'openai';

const [, , baseURL, model, apiKey = 'none'] = process.argv;
if (!baseURL || !model) {
  console.error('usage: node openai_client.mjs BASE_URL MODEL [API_KEY]');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
let checks = 0;
function check(cond, msg, extra) {
  checks++;
  if (!cond) {
    console.error(`FAIL: ${msg}` + (extra !== undefined ? `: ${JSON.stringify(extra)}` : ''));
    process.exit(1);
  }
}
const prompt = 'Hello, my name is';
const greedy = { model, prompt, max_tokens: 12, temperature: 0, ignore_eos: true };

// 1. plain completion
const r = await client.completions.create(greedy);
check(r.object === 'text_completion', 'object', r);
check(typeof r.id === 'string' && r.id.startsWith('cmpl-'), 'id', r.id);
check(r.model === model, 'model', r.model);
check(r.choices.length === 1 && typeof r.choices[0].text === 'string', 'choices', r.choices);
check(r.choices[0].index === 0 && r.choices[0].finish_reason === 'length', 'finish', r.choices[0]);
check(r.usage.completion_tokens === 12, 'usage.completion_tokens', r.usage);
check(r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, 'usage sum', r.usage);
const full = r.choices[0].text;

// 2. streaming gives the same greedy text, then a usage chunk
const stream = await client.completions.create({
  ...greedy, stream: true, stream_options: { include_usage: true },
});
let text = '', finish = null, usage = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  check(chunk.object === 'text_completion', 'chunk object', chunk);
  if (chunk.choices.length) {
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  if (chunk.usage) usage = chunk.usage;
}
check(text === full, 'streamed text equals the plain text', { text, full });
check(finish === 'length', 'streamed finish_reason', finish);
check(usage && usage.completion_tokens === 12, 'stream usage chunk', usage);
check(chunks >= 2, 'several chunks', chunks);

// 3. n: 2
const r2 = await client.completions.create({ model, prompt, max_tokens: 5, n: 2, seed: 3, ignore_eos: true });
check(r2.choices.length === 2, 'n: 2 gives two choices', r2.choices);
check(r2.choices.map((c) => c.index).sort().join() === '0,1', 'choice indexes', r2.choices);
check(r2.usage.completion_tokens === 10, 'n: 2 usage', r2.usage);

// 4. logprobs: 3
const r3 = await client.completions.create({ ...greedy, max_tokens: 4, logprobs: 3 });
const lp = r3.choices[0].logprobs;
check(lp && lp.tokens.length === 4 && lp.token_logprobs.length === 4, 'logprobs arrays', lp);
check(lp.top_logprobs.length === 4 && Object.keys(lp.top_logprobs[0]).length <= 3, 'top_logprobs', lp);
check(lp.text_offset.length === 4 && lp.text_offset[0] === 0, 'text_offset', lp.text_offset);
check(lp.token_logprobs.every((x) => x <= 0), 'logprobs are <= 0', lp.token_logprobs);
// greedy: the sampled token is the most likely one
const best = Math.max(...Object.values(lp.top_logprobs[0]));
check(Math.abs(best - lp.token_logprobs[0]) < 1e-4, 'greedy token is the top-1', lp);

// 5. echo
const r4 = await client.completions.create({ ...greedy, max_tokens: 3, echo: true });
check(r4.choices[0].text.startsWith(prompt), 'echo puts the prompt first', r4.choices[0].text);

// 6. stop: a piece of the greedy text
const mid = [...full];
const stopStr = mid.slice(Math.floor(mid.length / 2), Math.floor(mid.length / 2) + 1).join('');
if (stopStr.length > 0) {
  const r5 = await client.completions.create({ ...greedy, stop: [stopStr] });
  check(r5.choices[0].text === full.slice(0, full.indexOf(stopStr)), 'stop cuts before the stop string',
        { got: r5.choices[0].text, full, stopStr });
  check(r5.choices[0].finish_reason === 'stop', 'stop finish_reason', r5.choices[0]);
  const s5 = await client.completions.create({ ...greedy, stop: stopStr, stream: true });
  let st = '';
  for await (const c of s5) if (c.choices.length) st += c.choices[0].text;
  check(st === r5.choices[0].text, 'streamed stop text', { st });
}

// 7. seed: the same seed gives the same sample
const sampled = { model, prompt, max_tokens: 8, temperature: 1.0, seed: 1234, ignore_eos: true };
const a = await client.completions.create(sampled);
const b = await client.completions.create(sampled);
check(a.choices[0].text === b.choices[0].text, 'same seed, same text', [a.choices[0].text, b.choices[0].text]);

// 8. errors arrive as typed errors with OpenAI's shape
try {
  await client.completions.create({ model: 'no-such-model', prompt, max_tokens: 2 });
  check(false, 'unknown model must fail');
} catch (e) {
  check(e instanceof OpenAI.NotFoundError && e.status === 404, 'unknown model: 404', String(e));
}
try {
  await client.completions.create({ model, prompt, max_tokens: 2, temperature: 7 });
  check(false, 'temperature 7 must fail');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400, 'bad temperature: 400', String(e));
  check(e.param === 'temperature', 'error param', e.param);
}
if (apiKey !== 'none') {
  const bad = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  try {
    await bad.completions.create({ model, prompt, max_tokens: 2 });
    check(false, 'a wrong key must fail');
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, 'wrong key: 401', String(e));
  }
}
const models = await client.models.list();
check(models.data.some((m) => m.id === model), 'models.list has the model', models.data);

console.log(`openai client: all checks passed (${checks} checks)`);
