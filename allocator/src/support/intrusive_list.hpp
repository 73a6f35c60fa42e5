// A minimal intrusive doubly-linked list: O(1) push/erase with no allocation. A node may sit in
// several lists at once through different Link members.
#pragma once

#include "support/assert.hpp"

namespace cuarena::detail {

template <class T>
struct Link {
  T* prev = nullptr;
  T* next = nullptr;
  bool linked = false;
};

template <class T, Link<T> T::*L>
class IntrusiveList {
 public:
  bool empty() const { return head_ == nullptr; }
  T* front() const { return head_; }
  T* back() const { return tail_; }
  static T* next(const T* node) { return (node->*L).next; }
  static bool contains(const T* node) { return (node->*L).linked; }

  void push_back(T* node) { insert_before(nullptr, node); }

  /// Inserts `node` before `pos` (at the back when pos is nullptr).
  void insert_before(T* pos, T* node) {
    Link<T>& l = node->*L;
    CUARENA_ASSERT_INTERNAL(!l.linked, "inserting a node already in a list");
    l.linked = true;
    l.next = pos;
    l.prev = pos ? (pos->*L).prev : tail_;
    if (l.prev)
      (l.prev->*L).next = node;
    else
      head_ = node;
    if (pos)
      (pos->*L).prev = node;
    else
      tail_ = node;
  }

  void erase(T* node) {
    Link<T>& l = node->*L;
    CUARENA_ASSERT_INTERNAL(l.linked, "erasing a node in no list");
    if (l.prev)
      (l.prev->*L).next = l.next;
    else
      head_ = l.next;
    if (l.next)
      (l.next->*L).prev = l.prev;
    else
      tail_ = l.prev;
    l = Link<T>{};
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
};

}  // namespace cuarena::detail
