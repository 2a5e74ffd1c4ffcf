#!/usr/bin/env python3
"""Extract the uncompressed ELF vmlinux from a bzImage (like the kernel's scripts/extract-vmlinux):
scan for each compressor's magic, try to decompress from there, keep the first ELF result."""
import lzma, subprocess, sys, zlib

def candidates(data):
    for magic, how in ((b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zXZ\x00", "xz"), (b"\x1f\x8b\x08", "gzip")):
        i = data.find(magic)
        while i >= 0:
            yield i, how
            i = data.find(magic, i + 1)

def decompress(data, how):
    if how == "zstd":  # python3.11 has no zstd module: the zstd CLI copes with trailing garbage
        p = subprocess.run(["zstd", "-dcq"], input=data, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return p.stdout
    if how == "xz":
        return lzma.LZMADecompressor().decompress(data)
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)

def main():
    src, dst = sys.argv[1], sys.argv[2]
    data = open(src, "rb").read()
    for off, how in candidates(data):
        try:
            out = decompress(data[off:], how)
        except Exception:
            continue
        if out[:4] == b"\x7fELF":
            open(dst, "wb").write(out)
            print(f"{dst}: {len(out)} bytes ({how} at offset {off})")
            return 0
    print(f"{src}: no compressed ELF kernel found", file=sys.stderr)
    return 1

sys.exit(main())
