#!/usr/bin/env bash
# localhost/qm-example:1, an image to try jobs' --image with, built from Debian's
# busybox-static into the node agent's podman storage: apt fetches the package, no
# registry is contacted. Does nothing when the image is there already.
# Usage: deploy/images/example.sh [ROOT [DRIVER]]: the agent's containers storage_root
# (default .local/podman, the local stack's) and storage_driver (default overlay), as
# in its sandbox file (docs/containers.md). As root: the agent's podman runs as root.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="${QM_PYTHON:-$repo/.venv/bin/python}"
root="$(realpath -m "${1:-$repo/.local/podman}")"
driver="${2:-overlay}"
image=localhost/qm-example:1

if [ "$(id -u)" -ne 0 ]; then
  echo "example image: run it as root: the node agent's podman storage is root's" >&2
  exit 1
fi
if ! command -v podman >/dev/null; then
  echo "example image: podman is not installed (apt-get install podman runc)" >&2
  exit 1
fi
case "$driver" in
  overlay | vfs) ;;
  *) echo "example image: storage driver $driver: expected overlay or vfs" >&2; exit 2 ;;
esac

# The agent's containers.conf keeps podman's state apart from the host's, and podman
# records where that state is when its storage is new: write it before podman's first
# run (the agent writes it again each time it starts).
if [ ! -f "$root/containers.conf" ]; then
  (cd "$repo" && "$py" - "$root" "$driver") <<'PY'
import sys
from pathlib import Path

from libs.config.sandbox import ContainersEntry
from services.node_agent.containers import Storage, containers_conf, write_private

config = ContainersEntry(storage_root=sys.argv[1], storage_driver=sys.argv[2])
storage = Storage.of(config, Path(sys.argv[1]))
write_private(storage.conf, containers_conf(config, storage))
PY
fi

# As the agent runs podman: its storage, its containers.conf, none of this shell's variables.
in_storage() {
  env -i PATH="$PATH" CONTAINERS_CONF="$root/containers.conf" \
    podman --root "$root/storage" --runroot "$root/run" --storage-driver "$driver" "$@"
}

if in_storage image exists "$image"; then
  echo "$image: already in $root"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Root's apt fetches as _apt, which cannot write in a folder only root enters; a fresh
# host may have no package lists yet.
download() { (cd "$work" && apt-get download -q -o APT::Sandbox::User=root busybox-static); }
download || { apt-get update -q && download; } || {
  echo "example image: cannot download Debian's busybox-static with apt-get" >&2
  exit 1
}
rootfs="$work/rootfs"
dpkg-deb -x "$work"/busybox-static_*.deb "$rootfs"
rm -rf "${rootfs:?}/usr/share"
# busybox --install -s, as links in the image rather than on this host.
while IFS= read -r applet; do
  mkdir -p "$rootfs/$(dirname "$applet")"
  [ -e "$rootfs/$applet" ] || ln -s /bin/busybox "$rootfs/$applet"
done < <("$rootfs/bin/busybox" --list-full)
mkdir -p "$rootfs/etc" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/sh' \
  > "$rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' > "$rootfs/etc/group"

tar --numeric-owner --owner=0 --group=0 -C "$rootfs" -c . |
  in_storage import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/sh"]' \
    --message "busybox-static $(dpkg-deb -f "$work"/busybox-static_*.deb Version)" \
    - "$image" >/dev/null
echo "$image: imported into $root"
