#!/usr/bin/env bash
# loadtest.sh — a curl-driven load test for awqd's /v1/completions.
#
#   scripts/loadtest.sh [-u URL] [-c CLIENTS] [-n REQUESTS] [-p PROMPT_WORDS]
#                       [-m MAX_TOKENS] [-s STREAM_PERCENT] [-M MODEL] [-k API_KEY]
#                       [-t TEMPERATURE] [-e]
#
#   -u  base URL                         (default http://127.0.0.1:8000)
#   -c  concurrent clients               (default 8)
#   -n  requests in all                  (default 100)
#   -p  prompt length in words (~tokens) (default 32)
#   -m  max_tokens per request           (default 16)
#   -s  percent of requests streamed     (default 50)
#   -M  model name                       (default: the first of GET /v1/models)
#   -k  API key (Authorization: Bearer)
#   -t  temperature                      (default 1.0)
#   -e  let EOS end a completion early (default: ignore_eos, fixed lengths)
#   -I  send the prompt as token ids (for models without a tokenizer)
#
# Each client runs its share of the requests back to back with curl. Prints
# requests/s, output tokens/s, time to first token (streamed requests: time to
# the first byte of the answer, which the server sends with the first token)
# and latency percentiles, and the count of non-2xx answers. The last line is
# machine-readable:
#   RESULT requests=N non2xx=N rps=X tps=X ttft_p50=X ttft_p99=X lat_p50=X lat_p99=X
# Exit status: 0 when every answer was 2xx, 1 otherwise, 2 on usage errors.
set -euo pipefail

URL=http://127.0.0.1:8000
C=8
N=100
PROMPT_WORDS=32
MAX_TOKENS=16
STREAM_PCT=50
MODEL=""
KEY=""
TEMP=1.0
IGNORE_EOS=true
IDS=false

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while getopts "u:c:n:p:m:s:M:k:t:eIh" opt; do
  case $opt in
    u) URL=$OPTARG ;; c) C=$OPTARG ;; n) N=$OPTARG ;; p) PROMPT_WORDS=$OPTARG ;;
    m) MAX_TOKENS=$OPTARG ;; s) STREAM_PCT=$OPTARG ;; M) MODEL=$OPTARG ;; k) KEY=$OPTARG ;;
    t) TEMP=$OPTARG ;; e) IGNORE_EOS=false ;; I) IDS=true ;; *) usage ;;
  esac
done
for v in "$C" "$N" "$PROMPT_WORDS" "$MAX_TOKENS" "$STREAM_PCT"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "loadtest: numbers expected, got '$v'" >&2; exit 2; }
done
(( C >= 1 && N >= 1 )) || { echo "loadtest: -c and -n must be >= 1" >&2; exit 2; }
command -v curl >/dev/null || { echo "loadtest: curl not found" >&2; exit 2; }

AUTH=()
[[ -n $KEY ]] && AUTH=(-H "Authorization: Bearer $KEY")
if [[ -z $MODEL ]]; then
  MODEL=$(curl -sf "${AUTH[@]}" "$URL/v1/models" | sed -n 's/.*"data":\[{"id":"\([^"]*\)".*/\1/p')
  [[ -n $MODEL ]] || { echo "loadtest: cannot read the model name from $URL/v1/models" >&2; exit 2; }
fi

WORDS=(the quick brown fox jumps over a lazy dog while seven wizards quietly judge
       boxing matches in an old hall near the river and every one of them writes notes)
PROMPT=""
for ((i = 0; i < PROMPT_WORDS; i++)); do PROMPT+="${WORDS[i % ${#WORDS[@]}]} "; done
PROMPT="\"${PROMPT% }\""
if [[ $IDS == true ]]; then
  PROMPT="["
  for ((i = 0; i < PROMPT_WORDS; i++)); do PROMPT+="$((i % 97 + 3)),"; done
  PROMPT="${PROMPT%,}]"
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/awqd-loadtest.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# worker ID COUNT: runs COUNT requests; one result line each:
#   http_code time_starttransfer time_total streamed completion_tokens
worker() {
  local id=$1 count=$2 i stream body res tokens content out="$TMP/body.$1"
  for ((i = 0; i < count; i++)); do
    if (( (i * 37 + id * 11) % 100 < STREAM_PCT )); then stream=true; else stream=false; fi
    body="{\"model\":\"$MODEL\",\"prompt\":$PROMPT,\"max_tokens\":$MAX_TOKENS,"
    body+="\"temperature\":$TEMP,\"ignore_eos\":$IGNORE_EOS,\"stream\":$stream"
    [[ $stream == true ]] && body+=",\"stream_options\":{\"include_usage\":true}"
    body+="}"
    res=$(curl -s -N -o "$out" -w '%{http_code} %{time_starttransfer} %{time_total}' \
          "${AUTH[@]}" -H 'Content-Type: application/json' -d "$body" \
          "$URL/v1/completions" 2>/dev/null) || res="000 0 0"
    tokens=0 content=""
    [[ -f $out ]] && read -r -d '' content < "$out" || true
    [[ $content =~ \"completion_tokens\":([0-9]+) ]] && tokens=${BASH_REMATCH[1]}
    echo "$res $stream $tokens" >> "$TMP/res.$id"
  done
}

t0=$(date +%s.%N)
for ((w = 0; w < C; w++)); do
  share=$(( N / C + (w < N % C ? 1 : 0) ))
  (( share > 0 )) && worker "$w" "$share" &
done
wait
t1=$(date +%s.%N)

cat "$TMP"/res.* > "$TMP/all"
ELAPSED=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')

# pct FILE P: the P-th percentile of the numbers in FILE (nearest rank)
pct() {
  sort -g "$1" | awk -v p="$2" '{ v[NR] = $1 } END {
    if (NR == 0) { print "nan"; exit }
    k = int((p / 100) * NR + 0.999999); if (k < 1) k = 1; if (k > NR) k = NR; printf "%.4f", v[k] }'
}
awk '$4 == "true" && $1 ~ /^2/ { print $2 }' "$TMP/all" > "$TMP/ttft"
awk '$1 ~ /^2/ { print $3 }' "$TMP/all" > "$TMP/lat"
read -r TOTAL OK STREAMED TOKENS < <(awk '{ n++; if ($1 ~ /^2/) ok++; if ($4 == "true") s++; t += $5 }
  END { print n + 0, ok + 0, s + 0, t + 0 }' "$TMP/all")
NON2XX=$((TOTAL - OK))
RPS=$(awk -v n="$TOTAL" -v e="$ELAPSED" 'BEGIN { printf "%.2f", (e > 0 ? n / e : 0) }')
TPS=$(awk -v n="$TOKENS" -v e="$ELAPSED" 'BEGIN { printf "%.1f", (e > 0 ? n / e : 0) }')

printf 'awqd load test: %s, model %s\n' "$URL" "$MODEL"
printf '  clients %d, requests %d (%d streamed), prompt ~%d words, max_tokens %d\n' \
  "$C" "$TOTAL" "$STREAMED" "$PROMPT_WORDS" "$MAX_TOKENS"
printf '  elapsed          %s s\n' "$ELAPSED"
printf '  requests/s       %s\n' "$RPS"
printf '  output tokens    %d  (%s tokens/s)\n' "$TOKENS" "$TPS"
printf '  TTFT (streamed)  p50 %s  p90 %s  p99 %s  s\n' "$(pct "$TMP/ttft" 50)" \
  "$(pct "$TMP/ttft" 90)" "$(pct "$TMP/ttft" 99)"
printf '  latency          p50 %s  p90 %s  p99 %s  s\n' "$(pct "$TMP/lat" 50)" \
  "$(pct "$TMP/lat" 90)" "$(pct "$TMP/lat" 99)"
printf '  non-2xx answers  %d\n' "$NON2XX"
if (( NON2XX > 0 )); then
  printf '  status counts:'; awk '{ print $1 }' "$TMP/all" | sort | uniq -c | tr '\n' ' '; echo
fi
printf 'RESULT requests=%d non2xx=%d rps=%s tps=%s ttft_p50=%s ttft_p99=%s lat_p50=%s lat_p99=%s\n' \
  "$TOTAL" "$NON2XX" "$RPS" "$TPS" "$(pct "$TMP/ttft" 50)" "$(pct "$TMP/ttft" 99)" \
  "$(pct "$TMP/lat" 50)" "$(pct "$TMP/lat" 99)"
(( NON2XX == 0 ))
