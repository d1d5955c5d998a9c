#!/bin/sh
# Installs, without network, each .deb in DIR whose package the image lacks or has at an older
# version (the files were downloaded on the host: toolcage.image.debs). Run as root in an image build.
set -eu
dir=$1
set --
for f in "$dir"/*.deb; do
    [ -e "$f" ] || continue
    pkg=$(dpkg-deb -f "$f" Package)
    version=$(dpkg-deb -f "$f" Version)
    have=$(dpkg-query -W -f '${db:Status-Status} ${Version}\n' "$pkg" 2>/dev/null | head -n 1 || true)
    case "$have" in
        "installed "*) dpkg --compare-versions "${have#installed }" lt "$version" || continue ;;
    esac
    set -- "$@" "$f"
done
[ $# -eq 0 ] && exit 0
# documentation is left out as in the base (copyright notices stay)
DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold \
    --path-exclude='/usr/share/doc/*' --path-include='/usr/share/doc/*/copyright' \
    --path-exclude='/usr/share/man/*' --path-exclude='/usr/share/info/*' --path-exclude='/usr/share/locale/*' \
    "$@" >/dev/null
