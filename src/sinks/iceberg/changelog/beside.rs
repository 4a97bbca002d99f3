//! [`beside`]: two futures run to completion at once on two threads, the second borrowing what
//! the first does not. A changelog's rows and file are staged beside its table's own stage: the
//! commit thread is serial (planning, the image walk, manifests) while the other core is mostly
//! idle (docs/performance.md, "Streaming with the changelog on").

use std::future::Future;

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `here` on this thread and `there` on a scoped thread, each driven by the runtime's
/// handle (tasks they spawn run on its workers), and returns both outputs once both are done.
/// The calling task blocks meanwhile (`block_in_place`: a worker hands its other tasks on). On
/// a current-thread runtime (unit tests), one after the other on this task.
pub(in crate::sinks::iceberg) async fn beside<A, B>(here: A, there: B) -> (A::Output, B::Output)
where
    A: Future,
    B: Future + Send,
    B::Output: Send,
{
    let handle = Handle::current();
    if handle.runtime_flavor() != RuntimeFlavor::MultiThread {
        let a = here.await;
        return (a, there.await);
    }
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let other = scope.spawn(|| handle.block_on(there));
            let a = handle.block_on(here);
            match other.join() {
                Ok(b) => (a, b),
                // A panic there is one here, as if both ran on this thread.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    })
}
