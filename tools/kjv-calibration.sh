#!/usr/bin/env bash
# Calibration text for `deltaq imatrix` on the demo model (tiny-kjv): the King James Bible without the
# Gospel of John and Revelation (the model's held-out evaluation books; 1-3 John stay), from Debian's
# bible-kjv-text package.
#   tools/kjv-calibration.sh OUT.txt [EVAL.txt ...]
# The package's text is compressed in the format of Debian's `bible` reader, so its package
# (bible-kjv) is downloaded too and its program prints the verses ("Book C:V text", one per line).
# Formatting is that of the evaluation texts (eval-john.txt is reproduced byte for byte this way):
# verse references stripped, the verses of a chapter joined by spaces into one line, chapters
# separated by an empty line, a final newline. OUT is written atomically. Every EVAL text given
# (e.g. tests/fixtures/shared/text/eval-john.txt) is checked not to share a chapter with OUT.
set -euo pipefail
out=${1:?usage: tools/kjv-calibration.sh OUT.txt [EVAL.txt ...]}
shift
tmp=$(mktemp -d)
part=
trap 'rm -rf "$tmp" ${part:+"$part"}' EXIT
(cd "$tmp" && apt-get download bible-kjv-text bible-kjv >/dev/null 2>&1) ||
  { echo "apt-get download bible-kjv-text bible-kjv failed" >&2; exit 1; }
for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/pkg"; done
# -f: references and one verse per line (pretty-printing off); -p: the data file's folder.
"$tmp/pkg/usr/bin/bible" -f -p "$tmp/pkg/usr/lib" "gen1:1-rev22:21" >"$tmp/verses.txt" 2>/dev/null
n=$(wc -l <"$tmp/verses.txt")
[ "$n" -eq 31102 ] || { echo "expected the 31102 verses of the KJV, got $n lines" >&2; exit 1; }
# References look like Ge1:1, 1Sm3:4, John3:16, 1Jn1:1, Rev22:21.
awk '
{
  ref = $1; sub(/^[^ ]+ /, "")
  chapter = ref; sub(/:[0-9]+$/, "", chapter)
  book = chapter; sub(/[0-9]+$/, "", book)
  if (book == "John" || book == "Rev") next
  if (chapter != prev) { if (prev != "") printf "\n\n"; prev = chapter; sep = "" }
  printf "%s%s", sep, $0; sep = " "
}
END { printf "\n" }' "$tmp/verses.txt" >"$tmp/kjv.txt"
for eval in "$@"; do
  if grep -Fxq -f <(grep -v '^$' "$eval") "$tmp/kjv.txt"; then
    echo "$eval shares a chapter with the calibration text" >&2
    exit 1
  fi
done
out_dir=$(dirname "$out")
part=$(mktemp "$out_dir/.kjv-calibration.XXXXXX")
cp "$tmp/kjv.txt" "$part"
chmod 644 "$part"
mv -f "$part" "$out"
echo "wrote $out: $(wc -c <"$out") bytes, $(grep -c . "$out") chapters" >&2
