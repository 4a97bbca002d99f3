//! Replaces a plan's data files by their partitions' files, as [`Layout::arrange`] split them:
//! every position the plan names (cell fills, position deletes of superseded rows) moves with its
//! row, so the writer, the delete writers and the primary-key index, which all read the plan,
//! see the files as written. Pure.
//!
//! [`Layout::arrange`]: super::Layout::arrange

use iceberg::spec::Struct;

use super::Part;
use crate::sinks::iceberg::plan::{Fill, Plan, PlannedFile};

/// Replaces `plan.files[i]` by one file per part of `arranged[i]`, in order, and returns the
/// partition tuple of each new file. `Err` names an inconsistency (a part naming a row its file
/// does not have, or parts that do not cover the file), which would be a bug in the caller.
pub(crate) fn split_plan(plan: &mut Plan, arranged: Vec<Vec<Part>>) -> Result<Vec<Struct>, String> {
    if arranged.len() != plan.files.len() {
        return Err(format!(
            "{} files arranged for {} planned",
            arranged.len(),
            plan.files.len()
        ));
    }
    let old = std::mem::take(&mut plan.files);
    let mut partitions = Vec::new();
    // Per old file: old position → (new file, new position).
    let mut moved: Vec<Vec<(u32, u32)>> = Vec::with_capacity(old.len());
    for (i, (file, parts)) in old.iter().zip(arranged).enumerate() {
        let mut to = vec![(u32::MAX, u32::MAX); file.rows.len()];
        let mut covered = 0usize;
        for part in parts {
            let n = u32::try_from(plan.files.len()).map_err(|_| "too many files".to_owned())?;
            let mut rows = Vec::with_capacity(part.rows.len());
            for (new_pos, &p) in part.rows.iter().enumerate() {
                let (Some(row), Some(slot)) = (file.rows.get(p as usize), to.get_mut(p as usize))
                else {
                    return Err(format!("file {i} has no row {p}"));
                };
                rows.push(*row);
                *slot = (n, new_pos as u32);
                covered += 1;
            }
            plan.files.push(PlannedFile {
                rows,
                fills: Vec::new(),
            });
            partitions.push(part.partition);
        }
        if covered != file.rows.len() {
            return Err(format!(
                "file {i}: {covered} of {} rows arranged",
                file.rows.len()
            ));
        }
        for fill in &file.fills {
            let Some(&(n, pos)) = to.get(fill.pos as usize) else {
                return Err(format!("file {i} has no row {} to fill", fill.pos));
            };
            if let Some(f) = plan.files.get_mut(n as usize) {
                f.fills.push(Fill { pos, ..*fill });
            }
        }
        moved.push(to);
    }
    for f in &mut plan.files {
        f.fills.sort_by_key(|fill| (fill.pos, fill.column));
    }
    let mut deletes = Vec::with_capacity(plan.position_deletes.len());
    for &(f, pos) in &plan.position_deletes {
        let Some(&to) = moved.get(f as usize).and_then(|m| m.get(pos as usize)) else {
            return Err(format!(
                "position delete of row {pos} of file {f}, not planned"
            ));
        };
        deletes.push(to);
    }
    deletes.sort_unstable();
    plan.position_deletes = deletes;
    Ok(partitions)
}
