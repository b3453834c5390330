#pragma once
// Waits one thread can end from another: a store whose wait can be withdrawn (TcpStore: the
// client sends cancel_wait; EtcdStore: the watch stream is dropped) offers InterruptibleWait,
// and a caller that must stop promptly (the rendezvous' membership watcher) then waits long and
// interrupts instead of polling in short slices, each of which would be a request to the store.
//
//   WaitInterrupter interrupter;                       // shared by the two threads
//   // waiting thread:                                  // other thread:
//   interrupter.clear();  /* then check its flags */    set_flag(); interrupter.interrupt();
//   store.wait_interruptibly(keys, limit, interrupter); // returns kInterrupted at once
//
// interrupt() is sticky until clear(): a wait that starts after it returns kInterrupted at
// once, so the waiter clears, checks what it waits for, then waits (no lost wake-up).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ddp {

class WaitInterrupter {
 public:
  // Ends the wait in progress and any later one until clear(). Thread-safe.
  void interrupt();
  bool interrupted() const;
  void clear();

  // For stores: while the returned registration lives, interrupt() calls `wake` (under a lock:
  // it must not block and must not call back into this object); registering after interrupt()
  // calls it at once. The registration must not outlive this object.
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    ~Registration();

   private:
    friend class WaitInterrupter;
    Registration(WaitInterrupter* owner, uint64_t id) : owner_(owner), id_(id) {}
    WaitInterrupter* owner_ = nullptr;
    uint64_t id_ = 0;
  };
  Registration on_interrupt(std::function<void()> wake);

 private:
  mutable std::mutex mutex_;
  bool interrupted_ = false;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::function<void()>> wakes_;
};

enum class WaitOutcome { kSet, kTimedOut, kInterrupted };

// A store whose waits can be interrupted from another thread.
class InterruptibleWait {
 public:
  virtual ~InterruptibleWait() = default;
  // Like Store::wait, but returns instead of throwing: kSet once every key is set, kTimedOut
  // after `timeout`, kInterrupted soon (milliseconds) after `interrupter` is interrupted.
  // Other failures throw as Store::wait does.
  virtual WaitOutcome wait_interruptibly(const std::vector<std::string>& keys,
                                         std::chrono::milliseconds timeout,
                                         WaitInterrupter& interrupter) = 0;
};

}  // namespace ddp
