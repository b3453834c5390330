// LD_PRELOAD shim for fault-injection tests: the first write(2) into a snapshot temporary
// (a file whose name starts with '.' and contains ".tmp-", as write_file_atomically names
// them) writes only half of its bytes and then sleeps SLOW_SNAPSHOT_WRITE_DELAY_MS
// (default 200) before returning, so a test can SIGKILL the writer while the temporary is
// half written. The library itself has no such seam: production code never pauses.
//
// Contract: every other write passes straight to libc; write returning fewer bytes than
// asked is legal POSIX behaviour that the library's write loop must already handle.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef ssize_t (*write_fn)(int, const void*, size_t);

static int is_snapshot_temporary(int fd) {
  char link[64];
  char target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  const char* base = strrchr(target, '/');
  base = base ? base + 1 : target;
  return base[0] == '.' && strstr(base, ".tmp-") != NULL;
}

ssize_t write(int fd, const void* buf, size_t count) {
  static write_fn real_write;
  static ino_t last_slowed;  // the temporary already slowed once (one pause per file)
  if (!real_write) real_write = (write_fn)dlsym(RTLD_NEXT, "write");
  struct stat st;
  if (count < 2 || fd < 3 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_ino == last_slowed || !is_snapshot_temporary(fd)) {
    return real_write(fd, buf, count);
  }
  last_slowed = st.st_ino;
  const ssize_t written = real_write(fd, buf, count / 2);
  const char* env = getenv("SLOW_SNAPSHOT_WRITE_DELAY_MS");
  const long delay_ms = env ? atol(env) : 200;
  struct timespec pause = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
  nanosleep(&pause, NULL);
  return written;
}
