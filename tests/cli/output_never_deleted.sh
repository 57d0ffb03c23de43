#!/usr/bin/env bash
# output_never_deleted.sh LONGSEQ SCENARIO WORK: `longseq sweep -o` never deletes what it did not
# write: a non-empty directory is refused (its files intact), --overwrite replaces only
# results.{csv,json,md}, a file given as the directory is refused and left as it was, a user's
# results.json (named like longseq's, not in its manifest) is refused, and "x/.." is checked as
# the directory it names.
set -euo pipefail
longseq=$1 scenario=$2 work=$3
rm -rf "$work" && mkdir -p "$work/kept"
echo "a user's notes" > "$work/kept/notes.txt"
if "$longseq" sweep "$scenario" -o "$work/kept" -q 2> "$work/err.txt"; then echo "FAIL: a non-empty directory was accepted"; exit 1; fi
grep -q "holds files that longseq did not write (notes.txt); give --overwrite" "$work/err.txt" || { echo "FAIL: message: $(cat "$work/err.txt")"; exit 1; }
[ "$(cat "$work/kept/notes.txt")" = "a user's notes" ] || { echo "FAIL: notes.txt changed"; exit 1; }
"$longseq" sweep "$scenario" -o "$work/kept" -q --overwrite
[ -s "$work/kept/results.json" ] && [ "$(cat "$work/kept/notes.txt")" = "a user's notes" ] || { echo "FAIL: --overwrite lost notes.txt or wrote no results"; exit 1; }
"$longseq" sweep "$scenario" -o "$work/kept" -q --overwrite  # a rerun replaces the results, keeps the notes
mkdir -p "$work/earlier" && "$longseq" sweep "$scenario" -o "$work/earlier" -q
"$longseq" sweep "$scenario" -o "$work/earlier" -q  # an earlier sweep's directory is replaced without --overwrite
[ "$(ls "$work/kept" | sort | tr '\n' ' ')" = "notes.txt results.csv results.json results.md " ] || { echo "FAIL: left: $(ls -A "$work/kept")"; exit 1; }
echo "precious" > "$work/a-file"
if "$longseq" sweep "$scenario" -o "$work/a-file" -q 2> "$work/err.txt"; then echo "FAIL: a file was accepted as the directory"; exit 1; fi
grep -q "is a file, not a directory" "$work/err.txt" && [ "$(cat "$work/a-file")" = "precious" ] || { echo "FAIL: the file was touched"; exit 1; }
[ -z "$(ls -A "$work" | grep partial || true)" ] || { echo "FAIL: staging left behind"; exit 1; }
mkdir -p "$work/users" && echo '{"mine": 1}' > "$work/users/results.json"
if "$longseq" sweep "$scenario" -o "$work/users" -q 2> "$work/err.txt"; then echo "FAIL: a user's results.json was replaced"; exit 1; fi
grep -q "holds a file named like longseq's that longseq did not write (results.json)" "$work/err.txt" || { echo "FAIL: message: $(cat "$work/err.txt")"; exit 1; }
if "$longseq" sweep "$scenario" -o "$work/users/no-such/.." -q 2> "$work/err.txt"; then echo "FAIL: x/.. bypassed the check"; exit 1; fi
[ "$(cat "$work/users/results.json")" = '{"mine": 1}' ] || { echo "FAIL: results.json changed through .."; exit 1; }
echo "nothing of the user's was deleted"
