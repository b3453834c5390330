#pragma once
// What ddprun trusts on its own host: files, folders and sockets another local user could have
// placed are checked before they are read, followed or believed (issue 49). Internal header.

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::launcher::detail {

// The contents of `path` when it is a regular file of this user, opened without following a
// link and without blocking (a FIFO planted under the name), at most `max_bytes`; otherwise
// nullopt and `why` says what it is instead ("a symbolic link", "owned by uid 1001, ...").
std::optional<std::string> read_own_file(const std::string& path, size_t max_bytes,
                                         std::string& why);

// "" when `dir` is a folder of this user that no one else may write into or list (mode bits
// for group and others clear, not a link); otherwise why not, with its owner and mode.
std::string private_dir_problem(const std::string& dir);

// "" when the peer of the connected Unix socket `fd` is this user's process `pid`; otherwise
// who it is (SO_PEERCRED), so an agent's record cannot point a client at another's socket.
std::string socket_peer_problem(int fd, pid_t pid);

// `text` for a terminal: control characters (escape sequences, carriage returns, newlines
// inside a name) become \xNN, so text from a worker's stack cannot drive the user's terminal.
std::string printable(std::string_view text);

}  // namespace ddp::launcher::detail
