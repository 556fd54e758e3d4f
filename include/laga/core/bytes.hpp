// Byte sizes as people write them: "1GB" (10^9), "512MiB" (2^20), "64 KiB", "12345" (bytes).
#pragma once

#include <cstdint>
#include <string>

namespace laga {

// Usage error naming the text and the accepted forms.
int64_t parse_bytes(const std::string& text);
// This machine's available memory (MemAvailable of /proc/meminfo), in bytes.
int64_t available_memory_bytes();
// This process's peak resident set so far (VmHWM of /proc/self/status), in bytes: what the
// estimates of verify and bench are checked against.
int64_t peak_rss_bytes();
// This process's anonymous memory in transparent huge pages now (AnonHugePages of
// /proc/self/smaps_rollup), in bytes; −1 where it cannot be read.
int64_t anon_huge_page_bytes();

}  // namespace laga
