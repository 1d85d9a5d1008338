//! A shard-local event: tasks wait for the next notification (a flush finished, a rewarm
//! landed). Single-threaded, no allocation beyond the waiter list.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::task::{Poll, Waker};

#[derive(Default)]
pub struct LocalEvent {
    generation: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

impl LocalEvent {
    /// Wakes every task waiting now.
    pub fn notify_all(&self) {
        self.generation.set(self.generation.get() + 1);
        for w in self.waiters.take() {
            w.wake();
        }
    }

    /// The current generation: pass it to [`LocalEvent::wait_since`] to wait for the first
    /// notification after this moment (capture it before the attempt that may need to wait,
    /// so a notification between the attempt and the wait is not lost).
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// Resolves at the next `notify_all` after this call.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        self.wait_since(self.generation.get())
    }

    /// Resolves once a notification happened after generation `start`.
    pub fn wait_since(&self, start: u64) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.generation.get() != start {
                return Poll::Ready(());
            }
            let mut w = self.waiters.borrow_mut();
            if !w.iter().any(|x| x.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}
