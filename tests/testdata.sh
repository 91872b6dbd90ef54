#!/usr/bin/env bash
# tests/testdata.sh BUILD — lays out the test data under BUILD/testdata.
#
# Bulky test data is committed compressed (tests/data/GROUP/NAME.tar.xz, one archive per case) to
# keep the repository small. For each top-level GROUP of tests/data: if it holds archives, each
# is extracted to BUILD/testdata/GROUP/NAME/ (again only when the archive is newer) and its other
# entries are linked; otherwise the whole GROUP is linked. The suite reads BUILD/testdata
# (DF_TEST_DATA); tests/data itself is never modified.
set -euo pipefail
build=${1:-build}
dst="$build/testdata"
root=$(pwd)
mkdir -p "$dst"
for group in tests/data/*; do
  name=${group##*/}
  if compgen -G "$group/*.tar.xz" >/dev/null; then
    [ -L "$dst/$name" ] && rm -f "$dst/$name"
    mkdir -p "$dst/$name"
    for p in "$group"/*; do
      entry=${p##*/}
      if [[ $entry == *.tar.xz ]]; then
        out="$dst/$name/${entry%.tar.xz}"
        if [ ! -e "$out/.stamp" ] || [ "$p" -nt "$out/.stamp" ]; then
          rm -rf "$out" && mkdir -p "$out"
          tar -xJf "$p" -C "$out"
          touch "$out/.stamp"
        fi
      else
        ln -sfn "$root/$p" "$dst/$name/$entry"
      fi
    done
  else
    [ -d "$dst/$name" ] && [ ! -L "$dst/$name" ] && rm -rf "$dst/$name"
    ln -sfn "$root/$group" "$dst/$name"
  fi
done
