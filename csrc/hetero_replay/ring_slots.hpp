// The slot protocol of a ring that several processes write into (shared-memory
// and disk-tier storages, hetero_replay/storage/ring.py).
//
// Every slot has a 64-bit stamp in memory all writers map:
//   0       never written;
//   t + 1   holds the complete row of ticket t (tickets count adds, from 0);
//   < 0     being written: -((writer tag << 48) | (t + 1)), the marker of ticket t.
// A writer reserves tickets with one fetch_add on a shared counter, takes each
// slot (t mod capacity) by compare-and-swap from a committed stamp to its
// marker, writes the row, and publishes it with a release store of t + 1. A
// reader copies a row, then (acquire fence) re-reads the stamp: a row is
// intact iff its stamp did not change, the seqlock rule. No lock is held, so
// a writer killed at any point blocks nobody: its marker names it, and the
// others take the slot over once it is dead (decided by the caller).
#pragma once

#include <atomic>
#include <cstdint>

namespace hetero_replay {

constexpr int kTicketBits = 48;
constexpr int64_t kTicketMask = (int64_t{1} << kTicketBits) - 1;

inline int64_t ring_marker(int64_t tag, int64_t ticket) { return -((tag << kTicketBits) | (ticket + 1)); }
inline int64_t marker_ticket(int64_t stamp) { return ((-stamp) & kTicketMask) - 1; }

// What ring_acquire found for one ticket.
enum AcquireStatus : int8_t {
  kAcquired = 0,  // the slot carries this ticket's marker: write the row, then commit
  kLapped = 1,    // a newer ticket owns the slot already: this row is dropped
  kBlocked = 2,   // an older ticket's writer is mid-row: its marker is returned
};

inline int64_t load_acquire(const int64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

// Takes the slot of `ticket` for writer `tag`; on kBlocked, *blocker is the marker in the way.
inline AcquireStatus acquire_slot(int64_t* stamp, int64_t ticket, int64_t tag, int64_t* blocker) {
  const int64_t mine = ring_marker(tag, ticket);
  int64_t cur = load_acquire(stamp);
  for (;;) {
    if (cur >= 0) {
      if (cur >= ticket + 1) return kLapped;
    } else {
      if (marker_ticket(cur) >= ticket) return kLapped;
      *blocker = cur;
      return kBlocked;
    }
    // On failure `cur` is reloaded and the rules apply again.
    if (__atomic_compare_exchange_n(stamp, &cur, mine, false, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
      return kAcquired;
  }
}

// Replaces the marker of a dead writer with ours; false if the stamp moved meanwhile.
inline bool steal_slot(int64_t* stamp, int64_t dead_marker, int64_t tag, int64_t ticket) {
  int64_t expected = dead_marker;
  return __atomic_compare_exchange_n(stamp, &expected, ring_marker(tag, ticket), false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_ACQUIRE);
}

// Publishes the row of `ticket`: every store before this one is visible to a
// reader that sees t + 1. False if another writer took the slot over.
inline bool commit_slot(int64_t* stamp, int64_t ticket, int64_t tag) {
  int64_t expected = ring_marker(tag, ticket);
  return __atomic_compare_exchange_n(stamp, &expected, ticket + 1, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

}  // namespace hetero_replay
