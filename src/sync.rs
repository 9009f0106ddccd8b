//! Small helpers for std synchronisation primitives.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks a mutex whose holder may have panicked: every structure guarded
/// here stays consistent between statements, so a poisoned lock's data is
/// still good, and one panicking task must not take the server down.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`lock`] for the read side of an `RwLock`.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

/// [`lock`] for the write side of an `RwLock`.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// Places that tasks of many API keys share (a server's pipeline runs at
/// once), of which one key holds at most its share: a key whose tasks wait
/// (for an approval, a slow model) cannot hold every place while other
/// keys' tasks queue. A task waits for its key's place first, so one
/// queued on its key's share holds none of the shared places.
pub struct KeyedSlots {
    all: std::sync::Arc<tokio::sync::Semaphore>,
    per_key: usize,
    keys: Mutex<std::collections::HashMap<String, std::sync::Arc<tokio::sync::Semaphore>>>,
}

/// A place held; given back when dropped.
pub struct Slot {
    _key: tokio::sync::OwnedSemaphorePermit,
    _all: tokio::sync::OwnedSemaphorePermit,
}

/// Which bound a task waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotsFull {
    /// Its key holds its share.
    Key,
    /// Every place is held.
    All,
}

impl KeyedSlots {
    /// `total` places, at most `per_key` (clamped to `1..=total`) per key.
    pub fn new(total: usize, per_key: usize) -> KeyedSlots {
        KeyedSlots {
            all: std::sync::Arc::new(tokio::sync::Semaphore::new(total)),
            per_key: per_key.clamp(1, total.max(1)),
            keys: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The places of `owner` (the server's own tasks share one).
    fn of(&self, owner: Option<&str>) -> std::sync::Arc<tokio::sync::Semaphore> {
        lock(&self.keys)
            .entry(owner.unwrap_or_default().to_owned())
            .or_insert_with(|| std::sync::Arc::new(tokio::sync::Semaphore::new(self.per_key)))
            .clone()
    }

    /// A place now, or which bound is reached.
    pub fn try_take(&self, owner: Option<&str>) -> Result<Slot, SlotsFull> {
        let key = self
            .of(owner)
            .try_acquire_owned()
            .map_err(|_| SlotsFull::Key)?;
        let all = self
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| SlotsFull::All)?;
        Ok(Slot {
            _key: key,
            _all: all,
        })
    }

    /// Waits for a place: the key's first, then a shared one (`None` only
    /// if the slots were closed, which nothing does).
    pub async fn take(&self, owner: Option<&str>) -> Option<Slot> {
        let key = self.of(owner).acquire_owned().await.ok()?;
        let all = self.all.clone().acquire_owned().await.ok()?;
        Some(Slot {
            _key: key,
            _all: all,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_key_holds_its_share_and_leaves_the_rest() {
        let slots = KeyedSlots::new(3, 2);
        let a1 = slots.try_take(Some("a")).unwrap();
        let _a2 = slots.try_take(Some("a")).unwrap();
        assert_eq!(slots.try_take(Some("a")).err(), Some(SlotsFull::Key));
        let _b1 = slots.try_take(Some("b")).unwrap();
        assert_eq!(slots.try_take(Some("b")).err(), Some(SlotsFull::All));
        // A key's waiting task takes its place once one of its own ends.
        let waiting = tokio::spawn(async move { slots.take(Some("a")).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(a1);
        assert!(waiting.await.unwrap().is_some());
    }
}
