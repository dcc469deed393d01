/* cmd_tokenize.c — `awqd tokenize` and `awqd detokenize`: the tokenizer
 * (engine/tok.h) from the command line, for checks and batch use. */
#include "engine/tok.h"
#include "engine/util.h"
#include "server/cmd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char TOK_USAGE[] =
    "usage: awqd tokenize --model DIR (--text T | --file F | --jsonl F) [--json] [--special]\n\n"
    "Prints the token ids of a text, space-separated (--json: {\"ids\": [...]}).\n"
    "  --model DIR   a model directory or a directory holding tokenizer.json\n"
    "                (+ tokenizer_config.json); a tokenizer.json path also works\n"
    "  --text T      the text\n"
    "  --file F      the text is the whole file F (bytes as they are)\n"
    "  --jsonl F     one JSON object {\"text\": ...} per line; prints one\n"
    "                {\"ids\": [...]} line for each (- reads stdin)\n"
    "  --json        JSON output\n"
    "  --special     apply the post-processor (e.g. a BOS token)\n";

static const char DETOK_USAGE[] =
    "usage: awqd detokenize --model DIR --ids 1,2,3 [--skip-special] [--json]\n\n"
    "Prints the text of token ids (--json: {\"text\": ...}).\n"
    "  --skip-special  drop special tokens (skip_special_tokens)\n";

static void print_ids(const int32_t *ids, size_t n, int json) {
    if (json) fputs("{\"ids\": [", stdout);
    for (size_t i = 0; i < n; i++) printf(json ? "%s%d" : "%s%d", i ? (json ? ", " : " ") : "", (int)ids[i]);
    fputs(json ? "]}\n" : "\n", stdout);
}

static int tokenize_jsonl(struct tok *t, const char *path, int special) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "awqd tokenize: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    char *line = NULL, err[256];
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int status = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (len == 0) continue;
        cJSON *o = cJSON_ParseWithLength(line, (size_t)len);
        const cJSON *txt = cJSON_GetObjectItemCaseSensitive(o, "text");
        if (!cJSON_IsString(txt)) {
            fprintf(stderr, "awqd tokenize: %s:%ld: not a JSON object with a \"text\" string\n", path, lineno);
            cJSON_Delete(o);
            status = 1;
            break;
        }
        char *text = NULL;
        size_t tl = 0;
        if (util_json_string_member(line, (size_t)len, "text", &text, &tl) < 0) {
            fprintf(stderr, "awqd tokenize: %s:%ld: cannot read \"text\"\n", path, lineno);
            cJSON_Delete(o);
            status = 1;
            break;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = tok_encode(t, text, tl, special, &ids, &n, err, sizeof err);
        free(text);
        cJSON_Delete(o);
        if (rc < 0) {
            fprintf(stderr, "awqd tokenize: %s:%ld: %s\n", path, lineno, err);
            status = 1;
            break;
        }
        print_ids(ids, n, 1);
        free(ids);
    }
    free(line);
    if (f != stdin) fclose(f);
    return status;
}

int cmd_tokenize(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        fputs(TOK_USAGE, stdout);
        return 0;
    }
    const char *model = NULL, *text = NULL, *file = NULL, *jsonl = NULL;
    int json = 0, special = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--model") == 0 && has) model = argv[++i];
        else if (strcmp(a, "--text") == 0 && has) text = argv[++i];
        else if (strcmp(a, "--file") == 0 && has) file = argv[++i];
        else if (strcmp(a, "--jsonl") == 0 && has) jsonl = argv[++i];
        else if (strcmp(a, "--json") == 0) json = 1;
        else if (strcmp(a, "--special") == 0) special = 1;
        else {
            fprintf(stderr, "awqd tokenize: unknown or incomplete option \"%s\"\n\n%s", a, TOK_USAGE);
            return 2;
        }
    }
    if (!model || (!!text + !!file + !!jsonl) != 1) {
        fprintf(stderr, "awqd tokenize: need --model and exactly one of --text, --file, --jsonl\n\n%s", TOK_USAGE);
        return 2;
    }
    char err[512];
    struct tok *t;
    if (tok_load(model, &t, err, sizeof err) < 0) {
        fprintf(stderr, "awqd tokenize: %s\n", err);
        return 1;
    }
    int status = 0;
    if (jsonl) {
        status = tokenize_jsonl(t, jsonl, special);
    } else {
        char *buf = NULL;
        size_t len = text ? strlen(text) : 0;
        if (file && util_read_file(file, 0, &buf, &len, err, sizeof err) < 0) {
            fprintf(stderr, "awqd tokenize: %s\n", err);
            tok_free(t);
            return 1;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        if (tok_encode(t, file ? buf : text, len, special, &ids, &n, err, sizeof err) < 0) {
            fprintf(stderr, "awqd tokenize: %s\n", err);
            status = 1;
        } else {
            print_ids(ids, n, json);
        }
        free(ids);
        free(buf);
    }
    tok_free(t);
    return status;
}

int cmd_detokenize(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        fputs(DETOK_USAGE, stdout);
        return 0;
    }
    const char *model = NULL, *idstr = NULL;
    int json = 0, skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--model") == 0 && has) model = argv[++i];
        else if (strcmp(a, "--ids") == 0 && has) idstr = argv[++i];
        else if (strcmp(a, "--json") == 0) json = 1;
        else if (strcmp(a, "--skip-special") == 0) skip = 1;
        else {
            fprintf(stderr, "awqd detokenize: unknown or incomplete option \"%s\"\n\n%s", a, DETOK_USAGE);
            return 2;
        }
    }
    if (!model || !idstr) {
        fprintf(stderr, "awqd detokenize: need --model and --ids\n\n%s", DETOK_USAGE);
        return 2;
    }
    /* parse the list ourselves: any length, and a clear message on junk */
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = idstr;
    while (ids && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "awqd detokenize: --ids must be comma-separated integers, got \"%s\"\n", idstr);
            free(ids);
            return 2;
        }
        if (n == cap) {
            int32_t *ni = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!ni) { free(ids); ids = NULL; break; }
            ids = ni;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!ids) {
        fprintf(stderr, "awqd detokenize: out of memory\n");
        return 1;
    }
    char err[512];
    struct tok *t;
    if (tok_load(model, &t, err, sizeof err) < 0) {
        fprintf(stderr, "awqd detokenize: %s\n", err);
        free(ids);
        return 1;
    }
    char *text = NULL;
    size_t tl = 0;
    int status = 0;
    if (tok_decode(t, ids, n, skip, &text, &tl, err, sizeof err) < 0) {
        fprintf(stderr, "awqd detokenize: %s\n", err);
        status = 1;
    } else if (json) {
        cJSON *o = cJSON_CreateObject();
        char *s = NULL;
        if (o && cJSON_AddStringToObject(o, "text", text)) s = cJSON_PrintUnformatted(o);
        if (s) printf("%s\n", s);
        else { fprintf(stderr, "awqd detokenize: out of memory\n"); status = 1; }
        free(s);
        cJSON_Delete(o);
    } else {
        fwrite(text, 1, tl, stdout);
        fputc('\n', stdout);
    }
    free(text);
    free(ids);
    tok_free(t);
    return status;
}
