"""Makes an installed ddp (cmake --install into STAGE) relocatable: it carries the shared libraries
it links, as auditwheel does for the wheel, so that find_package(ddp) and ddprun need nothing from
the system but glibc, a compiler's libstdc++ and the user's LibTorch.

  1. The libraries behind the imported targets ddp's exported targets link (the build's
     ddp-bundled-dependencies.txt: "<target>|<file>|<include folders>|<definitions>"), and every
     library they, ddprun and the mpi plugin load (ldd), are copied into STAGE/lib/ddp-libs/ under
     the names they are loaded by, each with RUNPATH $ORIGIN; ddprun's and the plugin's RUNPATH
     point there. Left out: glibc's and the compiler's runtime libraries (every Linux has them)
     and MPI (the cluster's own: the plugin loads it only when the mpi backend is asked for).
  2. The headers ddp's public headers include (fmt's and spdlog's) go into
     STAGE/include/ddp/third_party/.
  3. STAGE/<cmake dir>/ddpBundledDependencies.cmake defines those targets over the copies;
     ddpConfig.cmake includes it instead of looking for the system's packages.
  4. Each copied library's Debian copyright file goes into STAGE/share/doc/ddp/licenses/.
  5. The Python package is taken out: Python users install the wheel (scripts/wheel.sh).

Usage: cpp_package_bundle.py STAGE DEPENDENCIES_TXT (needs ldd, dpkg and patchelf on PATH).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

LIBS = "ddp-libs"
# Loaded from the system wherever ddp runs: glibc's libraries and the compiler's runtime.
PLATFORM = re.compile(r"^(linux-vdso|ld-linux[-\w.]*|lib(c|m|dl|pthread|rt|resolv|util|anl)|"
                      r"libstdc\+\+|libgcc_s)\.so")
# The cluster's MPI, never carried: the mpi plugin loads it when the mpi backend is asked for.
MPI = re.compile(r"^lib(mpi|open-pal|open-rte|pmix)[\w.+-]*\.so")
# Header folders of the dependencies ddp's public headers include.
HEADERS = {"fmt::fmt": "fmt", "spdlog::spdlog": "spdlog"}
# Targets ddp's exported targets name only for linking header-only or optional parts.
INTERFACE_ONLY = {
    "CLI11::CLI11": "header-only; ddprun's command line, compiled into ddp's libraries",
    "nlohmann_json::nlohmann_json": "header-only; compiled into ddp's libraries",
    "MPI::MPI_CXX": "the mpi backend is a plugin (lib/libddp_comm_mpi.so) that loads the "
                    "cluster's MPI at run time; a program linking ddp::comm_mpi itself needs "
                    "find_package(MPI) first",
}


def fail(message):
    sys.exit(f"cpp_package_bundle: {message}")


def run(*command):
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def loaded_libraries(elf):
    """{name the library is loaded by: its path on this machine} of everything ELF loads."""
    found = {}
    for line in run("ldd", elf).splitlines():
        m = re.match(r"\s*(\S+) => (\S+) \(", line)
        if m:
            found[m.group(1)] = m.group(2)
        elif "not found" in line:
            fail(f"{elf} needs {line.split()[0]}, which this machine lacks")
    return found


def carried(name):
    return not PLATFORM.match(name) and not MPI.match(name)


def debian_packages(paths):
    """{path: the Debian package that installed it}, one dpkg query for all (merged /usr: a file
    may be registered under /lib or /usr/lib, and by its real name or a link's)."""
    spellings = {}
    for path in paths:
        real = os.path.realpath(path)
        for candidate in (path, real, re.sub(r"^/usr/lib/", "/lib/", real),
                          re.sub(r"^/usr/lib/", "/lib/", path)):
            spellings.setdefault(candidate, path)
    result = subprocess.run(["dpkg", "-S", *spellings], capture_output=True, text=True)
    owners = {}
    for line in result.stdout.splitlines():
        package, _, registered = line.rpartition(": ")
        if registered in spellings:
            owners[spellings[registered]] = package.split(":", 1)[0].split(",")[0].strip()
    missing = sorted(set(paths) - set(owners))
    if missing:
        fail(f"no Debian package owns {', '.join(missing)}: their licenses cannot be carried")
    return owners


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cpp_package_bundle.py STAGE DEPENDENCIES_TXT")
    stage, dependencies_txt = os.path.abspath(sys.argv[1]), sys.argv[2]
    config = glob.glob(f"{stage}/lib*/**/cmake/ddp/ddpConfig.cmake", recursive=True)
    if len(config) != 1:
        fail(f"{stage} holds no single lib*/cmake/ddp/ddpConfig.cmake: {config}")
    cmake_dir = os.path.dirname(config[0])
    lib_dir = os.path.dirname(os.path.dirname(cmake_dir))
    libs_dir = os.path.join(lib_dir, LIBS)
    os.makedirs(libs_dir, exist_ok=True)

    targets = []  # (target, soname, include folders, definitions)
    wanted = {}  # name loaded by -> path on this machine
    for line in open(dependencies_txt).read().splitlines():
        target, path, includes, definitions = line.split("|")
        soname = run("patchelf", "--print-soname", path).strip() or os.path.basename(path)
        targets.append((target, soname, includes, definitions))
        wanted[soname] = path
        wanted.update(loaded_libraries(path))
    ddprun = os.path.join(stage, "bin", "ddprun")
    wanted.update(loaded_libraries(ddprun))
    plugin = os.path.join(lib_dir, "libddp_comm_mpi.so")
    patched = [(ddprun, "$ORIGIN/" + os.path.relpath(libs_dir, os.path.dirname(ddprun)))]
    if os.path.exists(plugin):
        # Its own needs but MPI's, and theirs (ldd would list MPI's whole closure too).
        everything = loaded_libraries(plugin)
        for name in run("patchelf", "--print-needed", plugin).split():
            if carried(name):
                wanted[name] = everything[name]
                wanted.update(loaded_libraries(everything[name]))
        patched.append((plugin, f"$ORIGIN/{LIBS}"))

    carried_libraries = {name: path for name, path in sorted(wanted.items()) if carried(name)}
    for name, path in carried_libraries.items():
        copy = os.path.join(libs_dir, name)
        shutil.copyfile(path, copy)
        os.chmod(copy, 0o755)
        run("patchelf", "--set-rpath", "$ORIGIN", copy)
    packages = set(debian_packages(list(carried_libraries.values())).values())
    for elf, rpath in patched:
        run("patchelf", "--set-rpath", rpath, elf)

    third_party = os.path.join(stage, "include", "ddp", "third_party")
    for target, folder in HEADERS.items():
        include = next((t[2] for t in targets if t[0] == target), None)
        if include is None:
            fail(f"{dependencies_txt} does not list {target}, whose headers ddp's headers include")
        source = next((os.path.join(d, folder) for d in include.split(";")
                       if os.path.isdir(os.path.join(d, folder))), None)
        if source is None:
            fail(f"{target}'s include folders ({include}) hold no {folder}/")
        shutil.copytree(source, os.path.join(third_party, folder), dirs_exist_ok=True)

    licenses = os.path.join(stage, "share", "doc", "ddp", "licenses")
    os.makedirs(licenses, exist_ok=True)
    for package in sorted(packages):
        copyright_file = f"/usr/share/doc/{package}/copyright"
        if not os.path.isfile(copyright_file):
            fail(f"{package} (a library in the package) has no {copyright_file}")
        shutil.copyfile(copyright_file, os.path.join(licenses, f"{package}.copyright"))

    write_targets(cmake_dir, stage, libs_dir, third_party, targets)
    for python_dir in glob.glob(f"{lib_dir}/python3*"):
        shutil.rmtree(python_dir)
    print(f"cpp_package_bundle: {len(carried_libraries)} libraries in "
          f"{os.path.relpath(libs_dir, stage)} ({' '.join(carried_libraries)}); licenses of "
          f"{len(packages)} packages")


def write_targets(cmake_dir, stage, libs_dir, third_party, targets):
    def in_package(path):
        return "${_ddp_prefix}/" + os.path.relpath(path, stage)

    lines = [
        "# Written by scripts/cpp_package_bundle.py: the targets ddp's exported targets link,",
        f"# over the copies of their libraries this package carries in {LIBS}/ (each loads what it",
        "# needs from there: RUNPATH $ORIGIN). A program linking them finds them at link time",
        "# (-rpath-link) and at run time (-rpath), wherever the package was unpacked. A target the",
        "# project has already (from its own find_package(fmt), say) is kept.",
        f'get_filename_component(_ddp_prefix "${{CMAKE_CURRENT_LIST_DIR}}/'
        f'{os.path.relpath(stage, cmake_dir)}" ABSOLUTE)',
        f'set(_ddp_libs "{in_package(libs_dir)}")',
    ]
    for target, soname, _, definitions in targets:
        properties = [f'IMPORTED_LOCATION "${{_ddp_libs}}/{soname}"', f'IMPORTED_SONAME "{soname}"',
                      'INTERFACE_LINK_OPTIONS "LINKER:-rpath,${_ddp_libs};'
                      'LINKER:-rpath-link,${_ddp_libs}"']
        if target in HEADERS:
            properties.append(f'INTERFACE_INCLUDE_DIRECTORIES "{in_package(third_party)}"')
        if definitions:
            properties.append(f'INTERFACE_COMPILE_DEFINITIONS "{definitions}"')
        if target == "spdlog::spdlog":
            properties.append('INTERFACE_LINK_LIBRARIES "fmt::fmt"')
        lines += [f"if(NOT TARGET {target})",
                  f"  add_library({target} SHARED IMPORTED)",
                  f"  set_target_properties({target} PROPERTIES",
                  *[f"    {p}" for p in properties[:-1]], f"    {properties[-1]})",
                  "endif()"]
    for target, why in INTERFACE_ONLY.items():
        lines += [f"# {target}: {why}.", f"if(NOT TARGET {target})",
                  f"  add_library({target} INTERFACE IMPORTED)", "endif()"]
    with open(os.path.join(cmake_dir, "ddpBundledDependencies.cmake"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
