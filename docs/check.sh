#!/usr/bin/env bash
# Checks that the documentation names only paths that exist: every repository path in
# README.md and docs/*.md, written in backticks (`host/src/leader/`, `bash tests/run.sh`)
# or as a relative Markdown link ([x](../wit/provisioner.wit), ![plot](../bench/...png)),
# and the #anchor of a link to a Markdown file of the repository.
#
# A backticked word is a repository path when it starts with a top-level entry of the
# repository (`host/...`, `tests/...`, `.ci/run`, `Cargo.toml`, ...); paths relative to a
# folder named nearby (`runtime/src/`) and node paths (`/var/lib/...`) are not checked. A
# word with `*` must match at least one file; `{a,b}` is expanded. Build outputs that a
# fresh clone does not have (guests/dist/, deploy/modules/*.wasm, target/) are skipped.
# Fenced code blocks are not read.
#
# And a block marked as a copy of a file (the README's figures, from
# bench/results/figures.md) must equal that file.
#
# Prints FILE:LINE: what is missing, for each, and exits 1 if anything is.
#   bash docs/check.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

tracked=$(mktemp)
trap 'rm -f "$tracked"' EXIT
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files --cached --others --exclude-standard | sort -u >"$tracked"
else
  find . -type f -not -path './.git/*' | sed 's#^\./##' | sort -u >"$tracked"
fi
# every tracked file and every directory above one
all=$(awk -F/ '{ p = ""; for (i = 1; i < NF; i++) { p = p $i "/"; print p } print }' "$tracked" | sort -u)
top=$(awk -F/ '{ print $1 }' "$tracked" | sort -u)

exists() { # a repository path, relative to the root, possibly ending in /
  local p=${1#./}
  p=${p%/}
  [ -z "$p" ] && return 0
  if [[ $p == *'*'* ]]; then
    local re
    re=$(printf '%s' "$p" | sed -e 's/[.[\^$+?()|]/\\&/g' -e 's/\*/[^\/]*/g')
    grep -qE "^${re}/?$" <<<"$all"
  else
    grep -qxF -e "$p" -e "$p/" <<<"$all"
  fi
}

generated() {
  case $1 in
    guests/dist/* | deploy/modules/*.wasm | target/* | load-results/*) return 0 ;;
  esac
  return 1
}

slug() { # GitHub's heading anchor
  printf '%s' "$1" | tr '[:upper:]' '[:lower:]' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g'
}

anchors_of() { # the anchors of a Markdown file's headings
  awk '/^[ \t]*```/ { f = !f; next } !f && /^#+ / { sub(/^#+ +/, ""); print }' "$1" |
    while IFS= read -r h; do slug "$h"; echo; done
  grep -o '<a id="[^"]*"' "$1" | sed 's/<a id="//; s/"$//' || true
}

failed=0
fail() { echo "$1:$2: $3"; failed=1; }

for doc in README.md docs/*.md; do
  dir=$(dirname "$doc")
  # the file with fenced code blocks blanked, so line numbers stay right
  body=$(awk '/^[ \t]*```/ { f = !f; print ""; next } { print f ? "" : $0 }' "$doc")

  # backticked words
  while IFS= read -r hit; do
    line=${hit%%:*}
    span=${hit#*:}
    span=${span#\`}
    span=${span%\`}
    for word in $span; do
      word=${word##*=}
      word=${word%%[,;:)]}
      word=${word#(}
      first=${word%%/*}
      grep -qxF -- "$first" <<<"$top" || continue
      [[ $word == */* || $word == "$first" ]] || continue
      generated "$word" && continue
      # brace expansion: a/{b,c}.rs
      if [[ $word == *'{'*'}'* ]]; then
        pre=${word%%\{*}
        rest=${word#*\{}
        alts=${rest%%\}*}
        post=${rest#*\}}
        IFS=, read -ra parts <<<"$alts"
        for a in "${parts[@]}"; do
          exists "$pre$a$post" || fail "$doc" "$line" "\`$pre$a$post\` does not exist"
        done
        continue
      fi
      exists "$word" || fail "$doc" "$line" "\`$word\` does not exist"
    done
  done < <(grep -no '`[^`]*`' <<<"$body" || true)

  # relative links and images
  while IFS= read -r hit; do
    line=${hit%%:*}
    target=${hit#*:](}
    target=${target%)}
    target=${target%% *} # [x](path "title")
    case $target in
      http://* | https://* | mailto:* | '') continue ;;
    esac
    path=${target%%#*}
    anchor=
    [[ $target == *'#'* ]] && anchor=${target#*#}
    if [ -z "$path" ]; then
      file=$doc
    else
      file=$(realpath -m --relative-to="$root" "$dir/$path")
      if [[ $file == ../* ]]; then
        fail "$doc" "$line" "link ($target) leaves the repository"
        continue
      fi
      exists "$file" || { fail "$doc" "$line" "link ($target): $file does not exist"; continue; }
    fi
    if [ -n "$anchor" ] && [[ $file == *.md ]] && [ -f "$file" ]; then
      anchors_of "$file" | grep -qxF -- "$anchor" ||
        fail "$doc" "$line" "link ($target): no heading #$anchor in $file"
    fi
  done < <(grep -no '](\([^)]*\))' <<<"$body" || true)
done

# A block between `<!-- copy of FILE -->` and `<!-- end of copy -->` must be FILE's
# content (its first line, a comment saying so, left out): figures are written once.
for doc in README.md docs/*.md; do
  while IFS=: read -r line source; do
    copy=$(awk -v start="$line" 'NR > start && /^<!-- end of copy -->$/ { exit } NR > start' "$doc")
    if [ ! -f "$source" ]; then
      fail "$doc" "$line" "copy of $source: no such file"
    elif [ "$copy" != "$(tail -n +2 "$source")" ]; then
      fail "$doc" "$line" "the copy of $source differs from it: copy the file again"
    fi
  done < <(grep -n '^<!-- copy of .* -->$' "$doc" | sed -E 's/^([0-9]+):<!-- copy of (.*) -->$/\1:\2/')
done

if [ "$failed" != 0 ]; then
  echo "docs/check.sh: paths above are named in the documentation but do not exist"
  exit 1
fi
echo "docs/check.sh: every path named in README.md and docs/*.md exists"
