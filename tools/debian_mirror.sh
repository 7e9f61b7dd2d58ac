#!/usr/bin/env bash
# Prints the URI of the Debian archive this machine installs from, for tools
# that fetch Debian packages themselves (tools/torch2/run.sh, for mmdebstrap):
# $PSTRAIN_DEBIAN_MIRROR if set, else the first `deb` entry of the apt sources
# whose suite is one of Debian's own (a codename such as bookworm, or
# stable/testing/unstable; not -security, -updates, -backports, nor a third
# party's suite), in the order apt reads them: /etc/apt/sources.list, then
# /etc/apt/sources.list.d/*.list and *.sources (deb822) by name. Exits 1,
# saying so, when there is none. PSTRAIN_APT_SOURCES_DIR (default /etc/apt)
# points elsewhere for a test.
set -euo pipefail
if [ -n "${PSTRAIN_DEBIAN_MIRROR:-}" ]; then
  echo "$PSTRAIN_DEBIAN_MIRROR"
  exit 0
fi
apt_dir=${PSTRAIN_APT_SOURCES_DIR:-/etc/apt}
files=()
[ -f "$apt_dir/sources.list" ] && files+=("$apt_dir/sources.list")
for f in "$apt_dir"/sources.list.d/*; do
  case "$f" in *.list | *.sources) [ -f "$f" ] && files+=("$f") ;; esac
done
[ ${#files[@]} -gt 0 ] || { echo "no apt sources under $apt_dir; set PSTRAIN_DEBIAN_MIRROR" >&2; exit 1; }

# Each file's entries as lines "URI SUITE...", deb entries only, in order.
# One-line format: deb [options] URI SUITE COMPONENT...; deb822: stanzas of
# Types:, URIs:, Suites:, Enabled: fields separated by blank lines.
entries() {
  local f
  for f in "${files[@]}"; do
    case "$f" in
      *.sources)
        awk '
          function flush() {
            if (types ~ /(^| )deb( |$)/ && enabled != "no") {
              n = split(uris, u, " ")
              for (i = 1; i <= n; i++) print u[i], suites
            }
            types = uris = suites = enabled = ""
          }
          /^[ \t]*#/ { next }
          /^[ \t]*$/ { flush(); next }
          /^[^ \t]/ {
            key = tolower($1); sub(/:.*/, "", key)
            val = $0; sub(/^[^:]*:[ \t]*/, "", val)
            if (key == "types") types = val
            else if (key == "uris") uris = val
            else if (key == "suites") suites = val
            else if (key == "enabled") enabled = tolower(val)
          }
          END { flush() }' "$f"
        ;;
      *)
        awk '
          { sub(/#.*/, "") }
          $1 == "deb" {
            line = $0; sub(/^[ \t]*deb[ \t]+/, "", line)
            if (line ~ /^\[/) sub(/^\[[^]]*\][ \t]*/, "", line)
            split(line, w, /[ \t]+/)
            if (w[1] != "" && w[2] != "") print w[1], w[2]
          }' "$f"
        ;;
    esac
  done
}

debian_suites='^(stable|oldstable|oldoldstable|testing|unstable|sid|experimental|buster|bullseye|bookworm|trixie|forky|duke)$'
while read -r uri suites; do
  for suite in $suites; do
    if [[ $suite =~ $debian_suites ]]; then
      echo "${uri%/}"
      exit 0
    fi
  done
done < <(entries)
echo "no Debian archive among the apt sources under $apt_dir; set PSTRAIN_DEBIAN_MIRROR" >&2
exit 1
