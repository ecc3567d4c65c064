#pragma once
// Writing files so that a crash never leaves a half-written file under the final name:
// write to "<name>.tmp", fsync it, rename it over the final name, fsync the directory
// (POSIX makes rename atomic; the directory fsync makes the rename itself survive a power
// cut). Checkpoints are built from these steps, with the manifest written last.
//
// write_faults lets tests stop a write at a chosen point (as a crash or a full disk would)
// and check that what was there before is intact.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>

namespace loom::io {

// Called with the path about to be written ("<name>.tmp") before each durable write, and
// with the final path before each rename; a test hook throws or ends the process there.
struct write_faults {
    std::function<void(const std::filesystem::path&)> before_write;
    std::function<void(const std::filesystem::path&)> before_rename;
};

namespace detail {
inline std::string errno_text(int code) { return std::string(std::strerror(code)); }

LOOM_INLINE void fsync_path(const std::filesystem::path& path, bool directory, std::string_view who);
}  // namespace detail

// Flushes a directory's entries (new names, renames) to disk.
inline void fsync_directory(const std::filesystem::path& dir) { detail::fsync_path(dir, true, "fsync_directory"); }

// Writes to `target` atomically and durably what `produce(append)` passes to
// `append(std::span<const std::byte>)`, piece by piece, so that a large file need not be
// assembled in memory first. On any failure (no such directory, a read-only or full disk,
// an exception from `produce`) throws (loom::data_error for I/O), removes the temporary
// file and leaves whatever was at `target` untouched.
template <class Produce>
void write_file_durably_by_parts(const std::filesystem::path& target, Produce&& produce,
                                 const write_faults* faults = nullptr) {
    std::filesystem::path temporary = target;
    temporary += ".tmp";
    if (faults && faults->before_write) faults->before_write(temporary);
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        throw data_error("write_file_durably: cannot create '" + temporary.string() + "': " + detail::errno_text(errno) +
                         "; check that the directory exists and is writable");
    std::uint64_t written = 0;
    bool cleaned = false;
    auto fail = [&](const std::string& what) {
        const int code = errno;
        cleaned = true;
        ::close(fd);
        ::unlink(temporary.c_str());
        throw data_error("write_file_durably: " + what + " '" + temporary.string() + "' failed: " +
                         detail::errno_text(code) + "; free disk space or choose another directory (nothing at '" +
                         target.string() + "' was changed)");
    };
    auto append = [&](std::span<const std::byte> bytes) {
        const std::byte* at = bytes.data();
        std::size_t left = bytes.size();
        while (left > 0) {
            const ssize_t n = ::write(fd, at, left);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail("writing " + std::to_string(bytes.size()) + " bytes at offset " + std::to_string(written) + " of");
            at += n;
            left -= static_cast<std::size_t>(n);
            written += static_cast<std::uint64_t>(n);
        }
    };
    try {
        produce(append);
    } catch (...) {
        if (!cleaned) {
            ::close(fd);
            ::unlink(temporary.c_str());
        }
        throw;
    }
    if (::fsync(fd) != 0) fail("flushing");
    if (::close(fd) != 0) {
        const int code = errno;
        ::unlink(temporary.c_str());
        throw data_error("write_file_durably: closing '" + temporary.string() + "' failed: " + detail::errno_text(code) +
                         "; check the disk");
    }
    if (faults && faults->before_rename) faults->before_rename(target);
    if (::rename(temporary.c_str(), target.c_str()) != 0) {
        const int code = errno;
        ::unlink(temporary.c_str());
        throw data_error("write_file_durably: cannot rename '" + temporary.string() + "' to '" + target.string() +
                         "': " + detail::errno_text(code) + "; check that the directory is writable");
    }
    fsync_directory(target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path());
}

// Writes `bytes` to `target` atomically and durably (see write_file_durably_by_parts).
inline void write_file_durably(const std::filesystem::path& target, std::span<const std::byte> bytes,
                               const write_faults* faults = nullptr) {
    write_file_durably_by_parts(target, [&](auto& append) { append(bytes); }, faults);
}

inline void write_file_durably(const std::filesystem::path& target, std::string_view text,
                               const write_faults* faults = nullptr) {
    write_file_durably(target, std::as_bytes(std::span(text.data(), text.size())), faults);
}

}  // namespace loom::io

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::io::detail {

LOOM_INLINE void fsync_path(const std::filesystem::path& path, bool directory, std::string_view who) {
    const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        throw data_error(std::string(who) + ": cannot open '" + path.string() + "' to flush it: " + errno_text(errno) +
                         "; check that the directory exists and is readable");
    const int rc = ::fsync(fd);
    const int code = errno;
    ::close(fd);
    if (rc != 0 && code != EINVAL)  // some file systems cannot fsync directories
        throw data_error(std::string(who) + ": flushing '" + path.string() + "' to disk failed: " + errno_text(code) +
                         "; check the disk");
}

}  // namespace loom::io::detail
#endif  // LOOM_HEADER_DEFINITIONS
