/* tok.h — Hugging Face tokenizer.json byte-level BPE tokenizer and streaming
 * detokenizer (the kind Qwen2/2.5/3, Llama-3 and most current models use).
 *
 * Usage:
 *     struct tok *t;
 *     char err[256];
 *     if (tok_load("models/qwen3", &t, err, sizeof err) < 0) die(err);
 *     int32_t *ids; size_t n;
 *     tok_encode(t, text, strlen(text), 0, &ids, &n, err, sizeof err);
 *     char *s; size_t slen;
 *     tok_decode(t, ids, n, 1, &s, &slen, err, sizeof err);
 *     free(ids); free(s);
 *     tok_free(t);
 *
 * What is supported (anything else is refused by tok_load with a message that
 * names the unsupported part): model BPE with byte-level vocabulary (merges as
 * "a b" strings or ["a","b"] pairs, ignore_merges, no byte_fallback/dropout);
 * normalizer null | NFC | NFD | NFKC | NFKD | Sequence of those; pre-tokenizer
 * ByteLevel (use_regex, add_prefix_space) | Split (Regex or String pattern, all
 * five behaviours, invert=false) | Digits | Sequence of those, with a ByteLevel step;
 * post-processor null | ByteLevel | TemplateProcessing (single) | Sequence;
 * decoder ByteLevel. Unigram, WordPiece, WordLevel and SentencePiece-style BPE
 * (byte_fallback / Metaspace) are refused.
 *
 * Results match Hugging Face `tokenizers` (Rust) exactly; see docs/TOKENIZER.md
 * for the few documented divergences in corner cases.
 *
 * Cost: tok_load parses the JSON and builds its tables in ~0.3-0.7 s for a
 * 130-150k vocabulary (peak ~90 MB while the JSON tree is alive; the loaded
 * tables are ~20 MB plus a word cache of at most 32k words).
 *
 * Thread safety: tok_load/tok_free are not concurrent with anything else on the
 * same tok. Every other function may be called from any number of threads at
 * once on one loaded tok (the word cache inside is locked). A tok_stream is
 * owned by one thread at a time.
 *
 * Errors: functions returning int give 0 (or a count) on success and a negative
 * errno on failure, with a message in err[errlen] when err != NULL:
 *   -ENOENT  tokenizer.json missing        -EINVAL  bad JSON / bad argument / bad id
 *   -ENOTSUP unsupported tokenizer kind    -EILSEQ  text that is not valid UTF-8
 *   -ENOMEM  out of memory */
#ifndef AWQD_TOK_H
#define AWQD_TOK_H

#include <stddef.h>
#include <stdint.h>

struct tok;

/* Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (for
 * bos/eos tokens and add_bos_token). DIR may also name the tokenizer.json file
 * itself. On success *out owns everything; free with tok_free. */
int tok_load(const char *dir, struct tok **out, char *err, size_t errlen);
void tok_free(struct tok *t);

/* Encodes text[0..len) (bytes; NUL bytes are ordinary characters U+0000).
 * Text must be valid UTF-8: otherwise -EILSEQ with the byte offset in err, and
 * nothing is returned. add_special != 0 applies the post-processor (e.g. a BOS
 * from TemplateProcessing; Qwen3 and the npm Llama-3 file add nothing). Special
 * and added tokens written in the text are always recognised.
 * On success *ids is malloc'd (caller frees; may be NULL when *n == 0). */
int tok_encode(const struct tok *t, const char *text, size_t len, int add_special,
               int32_t **ids, size_t *n, char *err, size_t errlen);

/* Decodes ids[0..n) to text exactly as HF `decode(ids, skip_special_tokens)`:
 * bytes of all tokens concatenated, invalid UTF-8 replaced by U+FFFD (one per
 * maximal invalid subpart). skip_special != 0 drops special added tokens.
 * An id that is not in the vocabulary gives -EINVAL naming it. *out is
 * malloc'd and NUL-terminated (caller frees); *out_len excludes the NUL. */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n, int skip_special,
               char **out, size_t *out_len, char *err, size_t errlen);

/* The raw bytes token id decodes to on its own (not NUL-terminated, may be a
 * partial UTF-8 sequence, valid as long as t). NULL for an unknown id. */
const char *tok_token_bytes(const struct tok *t, int32_t id, size_t *len);

/* The token's string as written in tokenizer.json ("Ġhello", "<|im_end|>"),
 * NUL-terminated, valid as long as t; NULL for an unknown id. */
const char *tok_token_str(const struct tok *t, int32_t id);

/* Id of a token string as written in tokenizer.json (added tokens first, then
 * the model vocabulary), or -1. */
int32_t tok_token_to_id(const struct tok *t, const char *s, size_t len);

int32_t tok_vocab_size(const struct tok *t); /* largest id + 1, added tokens included */
int tok_is_special(const struct tok *t, int32_t id); /* 1 for a special added token */
int tok_is_valid(const struct tok *t, int32_t id);   /* 1 when id decodes */
int32_t tok_bos_id(const struct tok *t); /* tokenizer_config.json bos_token, or -1 */
int32_t tok_eos_id(const struct tok *t); /* tokenizer_config.json eos_token, or -1 */
/* 1 when tok_encode(add_special=1) prepends the BOS id. */
int tok_adds_bos(const struct tok *t);

/* ---- incremental (streaming) decoding ------------------------------------
 * Feed ids one at a time; each push returns the text that became complete.
 * The concatenation of all pushes and the flush equals tok_decode of all ids
 * with the same skip_special. Text returned never ends inside a UTF-8
 * sequence: bytes of an incomplete character wait for the next token; invalid
 * bytes come out as U+FFFD as soon as they are known to be invalid. */
struct tok_stream {
    const struct tok *t;
    int skip_special;
    uint8_t pending[4];   /* bytes of an unfinished UTF-8 character (< 4) */
    int npending;
    char *buf;            /* output of the last push/flush, NUL-terminated */
    size_t cap;
};

void tok_stream_init(struct tok_stream *s, const struct tok *t, int skip_special);
/* Returns the newly complete text (NUL-terminated, valid until the next call on
 * s; "" when nothing completed) and its length in *len, or NULL for an unknown
 * id (-EINVAL; the stream is unchanged) or out of memory. */
const char *tok_stream_push(struct tok_stream *s, int32_t id, size_t *len);
/* Emits what is left (an unfinished character becomes U+FFFD) and resets. */
const char *tok_stream_flush(struct tok_stream *s, size_t *len);
void tok_stream_free(struct tok_stream *s);

#endif
