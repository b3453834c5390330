"""Gives a ddp wheel the local version label of the torch it was built against.

The extension is bound to one torch release's C++ ABI, so the wheel's name says which:
ddp-0.1.0-cp311-... becomes ddp-0.1.0+torch2.13.0.cpu-cp311-... (PEP 440 local version; the
dist-info and data folders, METADATA's Version and RECORD follow). torch stays out of the
wheel's requirements on purpose: pip must never replace the user's torch for ddp.
Usage: wheel_torch_label.py WHEEL TORCH_VERSION (e.g. 2.13.0+cpu); prints the new wheel's path.
"""
import os
import re
import sys
import zipfile

from wheel_licenses import record_line  # RECORD's line for one file (this script's folder)


def local_label(torch_version):
    """'2.13.0+cpu' -> 'torch2.13.0.cpu' (local version segments: letters, digits, dots)."""
    label = "torch" + re.sub(r"[^A-Za-z0-9.]+", ".", torch_version).strip(".")
    if not re.fullmatch(r"[A-Za-z0-9]+(\.[A-Za-z0-9]+)*", label):
        sys.exit(f"wheel_torch_label: cannot make a version label of torch {torch_version!r}")
    return label


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: wheel_torch_label.py WHEEL TORCH_VERSION")
    wheel, torch_version = sys.argv[1], sys.argv[2]
    name, version, rest = os.path.basename(wheel).split("-", 2)
    if "+" in version:
        sys.exit(f"wheel_torch_label: {wheel} has a local version already")
    new_version = f"{version}+{local_label(torch_version)}"
    old_prefixes = (f"{name}-{version}.dist-info/", f"{name}-{version}.data/")
    out_path = os.path.join(os.path.dirname(wheel), f"{name}-{new_version}-{rest}")
    records = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out_path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            data = src.read(info.filename)
            new_name = info.filename
            for prefix in old_prefixes:
                if new_name.startswith(prefix):
                    new_name = prefix.replace(version, new_version, 1) + new_name[len(prefix):]
            if new_name.endswith(".dist-info/RECORD"):
                record_name = new_name
                continue
            if new_name.endswith(".dist-info/METADATA"):
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {new_version}".encode(), data, 1)
            info.filename = new_name
            out.writestr(info, data)
            records.append(record_line(new_name, data))
        records.append(f"{record_name},,")
        out.writestr(record_name, "\n".join(records) + "\n")
    os.remove(wheel)
    print(out_path)


if __name__ == "__main__":
    main()
