#!/bin/bash
# Build CRIU's zdtm static tests with -static and a derived image that carries them.
#
#   scripts/zdtm/build.sh
#
# 1. Unpacks CRIU's sources at $ZDTM_CRIU_REF (default v4.2, the release LazyFork runs)
#    from a git dir ($ZDTM_CRIU_GIT, default the fetched mirror) into $ZDTM_WORK/criu.
#    Nothing of CRIU is copied into this repository.
# 2. Installs the build packages of the host's own release if missing (no new apt
#    sources, nothing upgraded) and builds every test of test/zdtm/static's TST list
#    with LDFLAGS=-static (the default image has no gcc and no libaio/libcap).
# 3. Writes $ZDTM_WORK/manifest.json (choose.py: command lines, .desc data, skips).
# 4. Writes a `docker save` tarball $ZDTM_WORK/zdtm-image.tar: layer 1 is the default
#    image lazyfork/debian:bookworm as the store holds it, layer 2 is /zdtm/static with
#    the test binaries (a 0777 directory: non-suid tests run as uid 18943 as in zdtm.py),
#    and imports it as lazyfork/zdtm:$ZDTM_CRIU_REF into the harness's own state root.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
. "$HERE/env.sh"

REF=${ZDTM_CRIU_REF:-v4.2}
GITDIR=${ZDTM_CRIU_GIT:-/work/.mirror/checkpoint-restore+criu/repo}
SRC=$ZDTM_WORK/criu
STATIC=$SRC/test/zdtm/static
mkdir -p "$ZDTM_WORK"

if [ ! -f "$SRC/.zdtm-ref" ] || [ "$(cat "$SRC/.zdtm-ref")" != "$REF" ]; then
	[ -d "$GITDIR" ] || { echo "no CRIU git dir at $GITDIR (set ZDTM_CRIU_GIT)" >&2; exit 1; }
	rm -rf "$SRC" && mkdir -p "$SRC"
	git --git-dir="$GITDIR" archive "$REF" | tar -x -C "$SRC"
	echo "$REF" >"$SRC/.zdtm-ref"
fi

need=()
for p in gcc make pkg-config libc6-dev libaio-dev libcap-dev libnl-3-dev libnl-route-3-dev; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "installing ${need[*]}" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2
fi

tests=$(make -s --no-print-directory -C "$STATIC" -f Makefile -f - zdtm-list <<<$'zdtm-list:\n\t@echo $(TST)')
echo "building $(wc -w <<<"$tests") zdtm static tests (-static) in $STATIC" >&2
# -k: a test that does not build is reported as skipped by choose.py, not fatal.
nice -n 10 make -k -s -j2 -C "$STATIC" LDFLAGS=-static $tests >"$ZDTM_WORK/build.log" 2>&1 || true

python3 "$HERE/choose.py" "$STATIC" "$("$HERE/criu-path.sh")" "$ZDTM_WORK/manifest.json" >&2

# The derived image.
base=$(env -u LAZYFORK_ROOT -u LAZYFORK_RUN "$LF" --local image list --json |
	python3 -c 'import json,sys; print("\n".join(i["layers"][0] for i in json.load(sys.stdin) if i["name"] == "lazyfork/debian:bookworm" and len(i["layers"]) == 1))')
[ -n "$base" ] || { echo "no lazyfork/debian:bookworm in the default store: run make image" >&2; exit 1; }
stage=$(mktemp -d "$ZDTM_WORK/image.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests/zdtm/static" "$stage/out"
python3 - "$ZDTM_WORK/manifest.json" "$STATIC" "$stage/tests/zdtm/static" <<'EOF'
import json, shutil, sys, os
rows, src, dst = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
for r in rows:
    if os.access(os.path.join(src, r["test"]), os.X_OK):
        shutil.copy2(os.path.join(src, r["test"]), dst)
EOF
chmod 0777 "$stage/tests/zdtm/static"
tar --numeric-owner -C "$base" -cf "$stage/out/base.tar" .
tar --numeric-owner -C "$stage/tests" -cf "$stage/out/zdtm.tar" zdtm
python3 - "$stage/out" "$ZDTM_IMAGE" <<'EOF'
import hashlib, json, os, sys
out, name = sys.argv[1], sys.argv[2]
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
layers = ["base.tar", "zdtm.tar"]
diff = ["sha256:" + sha(os.path.join(out, l)) for l in layers]
cfg = json.dumps({"architecture": "amd64", "os": "linux",
                  "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                             "WorkingDir": "/zdtm/static"},
                  "rootfs": {"type": "layers", "diff_ids": diff}}).encode()
cname = hashlib.sha256(cfg).hexdigest() + ".json"
open(os.path.join(out, cname), "wb").write(cfg)
json.dump([{"Config": cname, "RepoTags": [name], "Layers": layers}], open(os.path.join(out, "manifest.json"), "w"))

EOF
cfgname=$(cd "$stage/out" && ls *.json | grep -v manifest.json)
tar -C "$stage/out" -cf "$ZDTM_WORK/zdtm-image.tar" manifest.json "$cfgname" base.tar zdtm.tar

"$LF" image rm "$ZDTM_IMAGE" >/dev/null 2>&1 || true
"$LF" image pull "$ZDTM_WORK/zdtm-image.tar" >&2
echo "image $ZDTM_IMAGE in $LAZYFORK_ROOT" >&2
