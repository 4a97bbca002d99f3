//! Work done while the pipeline's lease is kept (`checkpoint/lease/mod.rs`): the daemon's rounds and
//! `cdcd maintain`'s cycle both run this way, writing through the lease's fence.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::checkpoint::lease::{Lease, LeaseError};

/// Runs `work` while renewing `lease` (until `renewing` fires). A lost or expired lease drops
/// `work` mid-flight and is the error: a commit is one create-if-absent put, so dropping never
/// leaves half a commit; files written for it become orphans for `cdcd cleanup`. Work that
/// failed because the fence refused its writes lost the lease too: that is the error then, not
/// which write was refused (that is in the log), and the caller must not release what is not
/// its own. Otherwise the work's own outcome.
pub async fn while_kept<T: Default, E>(
    lease: &mut Lease,
    renewing: &CancellationToken,
    work: impl Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, LeaseError> {
    let fence = lease.fence();
    let outcome = {
        let keep = lease.keep(renewing);
        tokio::pin!(work, keep);
        tokio::select! {
            biased;
            kept = &mut keep => match kept {
                Err(e) => return Err(e),
                Ok(()) => Ok(T::default()),
            },
            done = &mut work => done,
        }
    };
    if outcome.is_err() {
        if let Err(fenced) = fence.check() {
            return Err(LeaseError::Fenced(fenced));
        }
    }
    Ok(outcome)
}
