// The ring slot protocol (ring_slots.hpp): single-thread rules, and writer
// threads racing a reader on a small ring (lapping it many times) where the
// reader must never accept a torn row. Under TSan this also checks the
// protocol's memory ordering; row words are atomics here, as the seqlock rule
// needs in C++ (the Python side copies rows with memcpy, then an acquire fence).
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "check.hpp"
#include "hetero_replay/ring_slots.hpp"

using namespace hr_test;
using namespace hetero_replay;

TEST_CASE(ring_slots, acquire_commit_lap_and_steal) {
  int64_t stamp = 0, blocker = 0;
  CHECK(acquire_slot(&stamp, 5, 1, &blocker) == kAcquired);
  CHECK(stamp == ring_marker(1, 5) && stamp < 0 && marker_ticket(stamp) == 5);
  // An older ticket of the same slot is lapped; a newer one is blocked by the marker.
  CHECK(acquire_slot(&stamp, 1, 2, &blocker) == kLapped);
  CHECK(acquire_slot(&stamp, 9, 2, &blocker) == kBlocked && blocker == ring_marker(1, 5));
  CHECK(!commit_slot(&stamp, 5, 2));  // not writer 2's marker
  CHECK(commit_slot(&stamp, 5, 1) && stamp == 6);
  CHECK(acquire_slot(&stamp, 5, 3, &blocker) == kLapped);  // its own ticket, already committed
  CHECK(acquire_slot(&stamp, 9, 2, &blocker) == kAcquired);
  // Writer 2 dies mid-row: writer 3 takes the slot over, and writer 2's late commit fails.
  CHECK(steal_slot(&stamp, ring_marker(2, 9), 3, 13));
  CHECK(!steal_slot(&stamp, ring_marker(2, 9), 4, 17));
  CHECK(!commit_slot(&stamp, 9, 2));
  CHECK(commit_slot(&stamp, 13, 3) && stamp == 14);
}

TEST_CASE(ring_slots, racing_writers_never_show_a_torn_row) {
  constexpr int64_t kSlots = 8, kWords = 16, kWriters = 3, kAdds = 20000;
  std::unique_ptr<int64_t[]> stamps(new int64_t[kSlots]());
  std::unique_ptr<std::atomic<int64_t>[]> rows(new std::atomic<int64_t>[kSlots * kWords]);
  for (int64_t i = 0; i < kSlots * kWords; ++i) rows[i].store(0);
  std::atomic<int64_t> counter{0};
  std::atomic<bool> done{false};

  auto writer = [&](int64_t tag) {
    for (int64_t k = 0; k < kAdds; ++k) {
      const int64_t t = counter.fetch_add(1);
      int64_t* stamp = stamps.get() + t % kSlots;
      int64_t blocker = 0;
      AcquireStatus st;
      while ((st = acquire_slot(stamp, t, tag, &blocker)) == kBlocked)
        std::this_thread::yield();  // all alive
      if (st == kLapped) continue;
      for (int64_t w = 0; w < kWords; ++w)
        rows[(t % kSlots) * kWords + w].store(t, std::memory_order_relaxed);
      CHECK(commit_slot(stamp, t, tag));
    }
  };
  int64_t accepted = 0, torn = 0;
  auto reader = [&] {
    std::vector<int64_t> copy(kWords);
    // Passes until one that began after every writer finished (on a busy machine every pass made while
    // they ran may meet only slots being rewritten): that last pass accepts every committed slot.
    for (bool last = false; !last;) {
      last = done.load();
      for (int64_t s = 0; s < kSlots; ++s) {
        const int64_t before = load_acquire(stamps.get() + s);
        if (before <= 0) continue;
        // Acquire loads keep the stamp's re-read after them (TSan does not model the fence Python's side
        // uses).
        for (int64_t w = 0; w < kWords; ++w) copy[w] = rows[s * kWords + w].load(std::memory_order_acquire);
        if (load_acquire(stamps.get() + s) != before) continue;  // rewritten meanwhile: not served
        ++accepted;
        for (int64_t w = 0; w < kWords; ++w) torn += copy[w] != before - 1;
      }
    }
  };
  std::thread r(reader);
  std::vector<std::thread> ws;
  for (int64_t tag = 1; tag <= kWriters; ++tag) ws.emplace_back(writer, tag);
  for (auto& w : ws) w.join();
  done.store(true);
  r.join();
  CHECK(torn == 0);
  CHECK(accepted > 0);
  // Every slot ends committed by the newest ticket that took it.
  for (int64_t s = 0; s < kSlots; ++s) CHECK(stamps[s] > 0);
}
