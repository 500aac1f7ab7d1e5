#!/usr/bin/env bash
# Vulkan headers new enough for the llama.cpp that llama-cpp-python vendors, where the system's
# are older (Debian 12's libvulkan-dev 1.3.239 lacks VK_EXT_layer_settings, which ggml-vulkan
# uses: "'LayerSettingEXT' is not a member of 'vk'"). Takes Debian 13's headers (libvulkan-dev
# and spirv-headers 1.4.309, from the Debian archive, checked by their SHA-256) into
# ~/.cache/superfluid/vulkan-1.4.309 and prints that prefix; prints nothing when the system's
# headers will do. The loader library and glslc stay the system's.
set -euo pipefail
need=261  # VK_EXT_layer_settings came with header 1.3.261
have=$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' /usr/include/vulkan/vulkan_core.h 2>/dev/null || true)
major=$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, \([0-9]*\), \([0-9]*\).*/\1\2/p' \
  /usr/include/vulkan/vulkan_core.h 2>/dev/null || true)
if [ -n "$have" ] && { [ "${major:-13}" -gt 13 ] || [ "$have" -ge "$need" ]; }; then
  exit 0
fi
prefix="${XDG_CACHE_HOME:-$HOME/.cache}/superfluid/vulkan-1.4.309"
if [ ! -f "$prefix/usr/include/vulkan/vulkan_core.h" ] || [ ! -d "$prefix/usr/share/cmake/SPIRV-Headers" ]; then
  mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  while read -r path sum; do
    curl -fsSL "$mirror/$path" -o "$tmp/pkg.deb"
    echo "$sum  $tmp/pkg.deb" | sha256sum -c --quiet
    dpkg-deb -x "$tmp/pkg.deb" "$tmp/root"
  done <<'DEBS'
pool/main/v/vulkan-loader/libvulkan-dev_1.4.309.0-1_amd64.deb 8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a
pool/main/s/spirv-headers/spirv-headers_1.6.1+1.4.309.0-1_all.deb dc18db866d63680351c40ac6b6bece34cb52da64a7799ce1cc4f16f6bff4d064
DEBS
  mkdir -p "$prefix/usr"
  rm -rf "$prefix/usr/include" "$prefix/usr/share"
  mv "$tmp/root/usr/include" "$prefix/usr/include"
  mkdir -p "$prefix/usr/share"
  mv "$tmp/root/usr/share/cmake" "$prefix/usr/share/cmake"
fi
echo "$prefix/usr"
