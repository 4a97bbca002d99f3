//! The plan of a commit to a keyless table (issue 23): the table is an append table, so the plan
//! is the inserted rows in order, cut into files at the [`FileLimits`] — no deletes, no lookups,
//! no fills, no key bookkeeping. A truncate drops everything before it (`Plan::truncate`).
//!
//! Why only inserts: nothing identifies a keyless row, so an update or delete cannot be applied
//! without guessing which of several equal rows it meant. The sources publish such tables
//! insert-only and stop on an update or delete of one; this refuses one that got here anyway,
//! and an insert with an absent cell (there is no earlier row to complete it from).

use super::cut::FileCutter;
use super::{FileLimits, Plan, PlanError, RowRef};
use crate::changelog::{Op, TableChanges};

/// The plan of `changes` (all of one keyless table, in order).
pub(super) fn plan_append(changes: &[TableChanges], limits: FileLimits) -> Result<Plan, PlanError> {
    let mut plan = Plan::default();
    let mut files = FileCutter::new(limits);
    for (b, c) in changes.iter().enumerate() {
        let batch = u32::try_from(b).map_err(|_| PlanError::TooLarge)?;
        let bytes = c.rows.get_array_memory_size() / c.len().max(1);
        for (r, op) in c.ops.iter().enumerate() {
            let row = u32::try_from(r).map_err(|_| PlanError::TooLarge)?;
            match op {
                Op::Truncate => {
                    plan = Plan {
                        truncate: true,
                        ..Plan::default()
                    };
                    files.clear();
                    continue;
                }
                Op::Insert => {}
                Op::Update | Op::Delete => return Err(PlanError::Keyless { op: *op }),
            }
            if let Some(column) = (0..c.schema.columns.len()).find(|&col| !c.is_present(col, r)) {
                return Err(PlanError::KeylessAbsent { column });
            }
            files.push(RowRef { batch, row }, bytes);
        }
    }
    plan.files = files.finish();
    Ok(plan)
}
