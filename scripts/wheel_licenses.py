"""Adds the license of every library auditwheel copied into a wheel (ddp.libs/) to the wheel.

auditwheel's SBOM (<dist-info>/sboms/auditwheel.cdx.json) names the Debian package each grafted
library came from; that package's copyright file (/usr/share/doc/<package>/copyright, Debian's
machine-readable license record) goes into <dist-info>/licenses/ddp.libs/<package>.copyright
(PEP 639's place for license files), and RECORD is written again to list them.
Usage: wheel_licenses.py WHEEL (rewritten in place). Fails naming any package without one.
"""
import base64
import hashlib
import json
import os
import sys
import tempfile
import urllib.parse
import zipfile


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def grafted_packages(sbom):
    """Debian package names of the components auditwheel grafted (purl pkg:deb/<vendor>/<name>@...)."""
    names = set()
    for component in sbom.get("components", []):
        purl = component.get("purl", "")
        if purl.startswith("pkg:deb/"):
            names.add(urllib.parse.unquote(purl.split("/", 2)[2].split("@", 1)[0]))
    return sorted(names)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: wheel_licenses.py WHEEL")
    wheel = sys.argv[1]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist_info = next(n.split("/", 1)[0] for n in names if n.endswith(".dist-info/RECORD"))
        sbom_name = f"{dist_info}/sboms/auditwheel.cdx.json"
        if sbom_name not in names:
            sys.exit(f"wheel_licenses: {wheel} has no {sbom_name} (auditwheel 6.2 or later writes it)")
        packages = grafted_packages(json.loads(z.read(sbom_name)))
        entries = [(info, z.read(info.filename)) for info in z.infolist()
                   if info.filename != f"{dist_info}/RECORD"]
    added = []
    for package in packages:
        path = f"/usr/share/doc/{package}/copyright"
        if not os.path.isfile(path):
            sys.exit(f"wheel_licenses: {package} (a library in the wheel) has no {path}")
        with open(path, "rb") as f:
            added.append((f"{dist_info}/licenses/ddp.libs/{package}.copyright", f.read()))
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(wheel)), suffix=".whl")
    os.close(fd)
    records = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for info, data in entries:
            out.writestr(info, data)
            records.append(record_line(info.filename, data))
        for name, data in added:
            out.writestr(name, data)
            records.append(record_line(name, data))
        records.append(f"{dist_info}/RECORD,,")
        out.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    os.replace(tmp, wheel)
    print(f"wheel_licenses: {len(added)} licenses of the libraries in the wheel: "
          f"{' '.join(packages)}")


if __name__ == "__main__":
    main()
