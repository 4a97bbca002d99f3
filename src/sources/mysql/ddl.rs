//! `ALTER TABLE` statements from the binlog, applied to a captured table's columns (pure).
//!
//! MySQL and MariaDB write DDL to the binlog as the statement's text in a QUERY_EVENT; the rows
//! events after it are encoded with the new shape, and the server keeps no record of the old one
//! (`information_schema` shows only the present). So cdcd parses the statement itself (with the
//! `sqlparser` crate's MySQL dialect, not by pattern matching) and derives the table's next
//! columns from the ones in force before it, in the form `information_schema.columns` gives them
//! ([`ColumnInfo`]), so the same converters decode the rows that follow.
//!
//! What is applied: `ADD [COLUMN]` of a nullable column with no default (or `DEFAULT NULL`) at the
//! end; `RENAME COLUMN` (the old name is kept in `former_names`, so the lake renames its column
//! rather than dropping one and adding another); `MODIFY`/`CHANGE` of a column, in place (renamed
//! by `CHANGE old new`), to a type whose values widen
//! (checked by the caller with [`TableSchema::evolves_to`](crate::changelog::TableSchema::evolves_to)),
//! or to the same type with another length, nullability or default; `ALTER COLUMN … SET/DROP
//! DEFAULT`; `DROP [COLUMN]`; and the operations that leave columns alone (indexes, constraints other than the
//! primary key, `ALGORITHM`, `LOCK`, `AUTO_INCREMENT`, table options). Anything else — a
//! reordered column, a column added with an expression default the source fills into existing rows,
//! a primary-key change, a statement the parser cannot read — is an [`AlterError`] naming what,
//! and the stream stops rather than guess.

use sqlparser::ast::{
    AlterColumnOperation, AlterTableOperation, ColumnOption, DataType as SqlType, Expr, ObjectName,
    Statement, TableConstraint,
};
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;

use mysql_common::value::Value;

use super::types::{parse_default, ColumnDefault, ColumnInfo};

/// Why an `ALTER TABLE` cannot be applied; the message names the operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AlterError(pub String);

/// The columns after `sql` (an `ALTER TABLE` of the table whose columns are `columns`, in
/// ordinal order). `default_charset` is the table's character set, for text columns added
/// without one.
pub fn apply_alter(
    sql: &str,
    columns: &[ColumnInfo],
    default_charset: &str,
) -> Result<Vec<ColumnInfo>, AlterError> {
    let statements = Parser::parse_sql(&MySqlDialect {}, sql)
        .map_err(|e| AlterError(format!("the statement cannot be parsed: {e}")))?;
    let [Statement::AlterTable(alter)] = statements.as_slice() else {
        return Err(AlterError("not a single ALTER TABLE statement".into()));
    };
    let mut next = columns.to_vec();
    for op in &alter.operations {
        if let AlterTableOperation::AddColumn { column_def, .. } = op {
            let name = &column_def.name.value;
            let existed = columns.iter().any(|c| c.name.eq_ignore_ascii_case(name));
            if existed && position_of(&next, name).is_none() {
                return Err(AlterError(format!(
                    "column {name} is dropped and added again; the lake cannot tell the new column from the old one"
                )));
            }
        }
        apply_operation(op, &mut next, default_charset)?;
    }
    Ok(next)
}

fn apply_operation(
    op: &AlterTableOperation,
    columns: &mut Vec<ColumnInfo>,
    default_charset: &str,
) -> Result<(), AlterError> {
    match op {
        AlterTableOperation::AddColumn {
            column_def,
            column_position,
            if_not_exists,
            ..
        } => add_column(
            columns,
            column_def,
            column_position.is_some(),
            *if_not_exists,
            default_charset,
        ),
        AlterTableOperation::ModifyColumn {
            col_name,
            data_type,
            options,
            column_position,
        } => redefine(
            columns,
            &col_name.value,
            &col_name.value,
            data_type,
            options,
            column_position.is_some(),
            default_charset,
        ),
        AlterTableOperation::ChangeColumn {
            old_name,
            new_name,
            data_type,
            options,
            column_position,
        } => redefine(
            columns,
            &old_name.value,
            &new_name.value,
            data_type,
            options,
            column_position.is_some(),
            default_charset,
        ),
        AlterTableOperation::AlterColumn { column_name, op } => {
            alter_column(columns, &column_name.value, op)
        }
        AlterTableOperation::DropColumn {
            column_names,
            if_exists,
            ..
        } => drop_columns(columns, column_names, *if_exists),
        AlterTableOperation::RenameColumn {
            old_column_name,
            new_column_name,
        } => rename(columns, &old_column_name.value, &new_column_name.value),
        AlterTableOperation::AddConstraint { constraint, .. } => match constraint {
            TableConstraint::PrimaryKey(_) => Err(AlterError(
                "the primary key changes (ADD PRIMARY KEY)".into(),
            )),
            _ => Ok(()),
        },
        AlterTableOperation::DropPrimaryKey { .. } => Err(AlterError(
            "the primary key changes (DROP PRIMARY KEY)".into(),
        )),
        // Indexes, constraints and table options leave the columns and their encoding alone.
        AlterTableOperation::DropConstraint { .. }
        | AlterTableOperation::DropIndex { .. }
        | AlterTableOperation::DropForeignKey { .. }
        | AlterTableOperation::RenameConstraint { .. }
        | AlterTableOperation::Algorithm { .. }
        | AlterTableOperation::Lock { .. }
        | AlterTableOperation::AutoIncrement { .. }
        | AlterTableOperation::ValidateConstraint { .. }
        | AlterTableOperation::SetOptionsParens { .. } => Ok(()),
        other => Err(AlterError(format!("{other} is not applied"))),
    }
}

/// `ADD COLUMN`: applied at the end of the table only, with a default existing rows can read.
fn add_column(
    columns: &mut Vec<ColumnInfo>,
    column_def: &sqlparser::ast::ColumnDef,
    positioned: bool,
    if_not_exists: bool,
    default_charset: &str,
) -> Result<(), AlterError> {
    let name = &column_def.name.value;
    if position_of(columns, name).is_some() {
        return if if_not_exists {
            Ok(())
        } else {
            Err(AlterError(format!("column {name} already exists")))
        };
    }
    if positioned {
        return Err(AlterError(format!(
            "column {name} is added FIRST or AFTER another column; only columns added at the end are applied"
        )));
    }
    let options: Vec<&ColumnOption> = column_def.options.iter().map(|o| &o.option).collect();
    let column = column_info(name, &column_def.data_type, &options, default_charset)?;
    // The source fills existing rows with the default: the lake stores it as the
    // column's initial default (`added_default`); without one they read NULL, which a
    // NOT NULL column cannot.
    match added_default(&column)? {
        Some(_) => {}
        None if !column.nullable => {
            return Err(AlterError(format!(
                "column {name} is added NOT NULL without a default: MySQL fills existing rows with an implicit value the lake cannot know"
            )));
        }
        None => {}
    }
    columns.push(column);
    Ok(())
}

/// `ALTER COLUMN name SET DEFAULT / DROP DEFAULT`.
fn alter_column(
    columns: &mut [ColumnInfo],
    name: &str,
    op: &AlterColumnOperation,
) -> Result<(), AlterError> {
    let Some(i) = position_of(columns, name) else {
        return Err(AlterError(format!("column {name} does not exist")));
    };
    match op {
        AlterColumnOperation::SetDefault { value } => {
            columns[i].default = Some(default_text(value));
            Ok(())
        }
        AlterColumnOperation::DropDefault => {
            columns[i].default = None;
            Ok(())
        }
        other => Err(AlterError(format!("ALTER COLUMN {name} {other}"))),
    }
}

/// `DROP COLUMN`s.
fn drop_columns(
    columns: &mut Vec<ColumnInfo>,
    column_names: &[sqlparser::ast::Ident],
    if_exists: bool,
) -> Result<(), AlterError> {
    // Metadata only in the lake: the column leaves the schema, old files keep it. A key
    // column's drop changes the key, which the caller refuses.
    for name in column_names {
        match position_of(columns, &name.value) {
            Some(i) => {
                columns.remove(i);
            }
            None if if_exists => {}
            None => {
                return Err(AlterError(format!("column {name} does not exist")));
            }
        }
    }
    Ok(())
}

/// The value rows that predate `column` read when it is added, as text (`None`: NULL): its
/// DEFAULT when that is a constant; an expression default (`CURRENT_TIMESTAMP`, `uuid()`) gives
/// each existing row a value the binlog does not carry, which is an error.
pub fn added_default(column: &ColumnInfo) -> Result<Option<String>, AlterError> {
    match parse_default(column.default.as_deref(), true) {
        ColumnDefault::Value(Value::NULL) => Ok(None),
        ColumnDefault::Value(Value::Bytes(bytes)) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        ColumnDefault::Value(other) => Ok(Some(format!("{other:?}"))),
        ColumnDefault::Expr(expr) => Err(AlterError(format!(
            "column {} is added with DEFAULT {expr}, an expression: each existing row got a value the binlog does not carry",
            column.name
        ))),
    }
}

/// `MODIFY`/`CHANGE`: the column keeps its place and (for now) its name; its type, nullability
/// and default are what the clause says (MySQL redefines the whole column: no `NOT NULL` means
/// nullable, no `DEFAULT` means none).
fn redefine(
    columns: &mut [ColumnInfo],
    old: &str,
    new: &str,
    data_type: &SqlType,
    options: &[ColumnOption],
    moved: bool,
    default_charset: &str,
) -> Result<(), AlterError> {
    let Some(i) = position_of(columns, old) else {
        return Err(AlterError(format!("column {old} does not exist")));
    };
    if moved {
        return Err(AlterError(format!(
            "column {old} is moved (FIRST/AFTER); only columns kept in place are applied"
        )));
    }
    rename(columns, old, new)?;
    let options: Vec<&ColumnOption> = options.iter().collect();
    let mut column = column_info(&columns[i].name, data_type, &options, default_charset)?;
    column.former_names = columns[i].former_names.clone();
    // A text column keeps its character set unless the clause names one (MySQL keeps the table's
    // default, which is what the column had when it was not declared otherwise).
    if column.charset.is_some() && !has_charset(&options) {
        column.charset = columns[i].charset.clone().or(column.charset);
    }
    columns[i] = column;
    Ok(())
}

/// `RENAME COLUMN old TO new`, or `CHANGE old new …`: the column keeps its place, its values and
/// (in the lake) its field id; `old` joins its former names, so a sink that still holds it under
/// `old` renames it. A case-only change is a rename too (MySQL names are case-insensitive, the
/// lake's are not).
fn rename(columns: &mut [ColumnInfo], old: &str, new: &str) -> Result<(), AlterError> {
    if old == new {
        return Ok(());
    }
    let Some(i) = position_of(columns, old) else {
        return Err(AlterError(format!("column {old} does not exist")));
    };
    if position_of(columns, new).is_some_and(|j| j != i) {
        return Err(AlterError(format!("column {new} already exists")));
    }
    let column = &mut columns[i];
    let former = std::mem::replace(&mut column.name, new.to_owned());
    column.former_names.retain(|n| n != new);
    column.former_names.push(former);
    Ok(())
}

fn position_of(columns: &[ColumnInfo], name: &str) -> Option<usize> {
    // MySQL column names are case-insensitive.
    columns
        .iter()
        .position(|c| c.name.eq_ignore_ascii_case(name))
}

fn has_charset(options: &[&ColumnOption]) -> bool {
    options
        .iter()
        .any(|o| matches!(o, ColumnOption::CharacterSet(_)))
}

/// A column as `information_schema.columns` would describe it after the statement.
fn column_info(
    name: &str,
    data_type: &SqlType,
    options: &[&ColumnOption],
    default_charset: &str,
) -> Result<ColumnInfo, AlterError> {
    let column_type = data_type.to_string().to_ascii_lowercase();
    let base = column_type
        .split(|c: char| c == '(' || c.is_whitespace())
        .next()
        .unwrap_or_default()
        .to_owned();
    let data_type_name = match base.as_str() {
        "bool" | "boolean" => "tinyint".to_owned(),
        "integer" => "int".to_owned(),
        "real" => "double".to_owned(),
        "dec" | "fixed" => "decimal".to_owned(),
        "json" => {
            // MariaDB stores JSON as LONGTEXT with a check and MySQL as binary JSON: which one
            // the rows carry depends on the server, which this pure step does not know.
            return Err(AlterError(format!(
                "column {name} has type JSON; JSON columns added by ALTER TABLE are not applied yet"
            )));
        }
        other => other.to_owned(),
    };
    let (precision, scale) = match data_type_name.as_str() {
        "decimal" | "numeric" => decimal_digits(&column_type),
        _ => (None, None),
    };
    let text = matches!(
        data_type_name.as_str(),
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "enum" | "set"
    );
    let charset = if text {
        let named = options.iter().find_map(|o| match o {
            ColumnOption::CharacterSet(n) => Some(object_name(n)),
            _ => None,
        });
        Some(named.unwrap_or_else(|| default_charset.to_owned()))
    } else {
        None
    };
    let not_null = options
        .iter()
        .any(|o| matches!(o, ColumnOption::NotNull) || matches!(o, ColumnOption::PrimaryKey(_)));
    let default = options.iter().find_map(|o| match o {
        ColumnOption::Default(e) => Some(default_text(e)),
        _ => None,
    });
    let default = default.filter(|d| !d.eq_ignore_ascii_case("null"));
    Ok(ColumnInfo {
        name: name.to_owned(),
        data_type: data_type_name,
        column_type,
        numeric_precision: precision,
        numeric_scale: scale,
        charset,
        nullable: !not_null,
        json_check: false,
        default,
        former_names: Vec::new(),
        srid: None,
    })
}

/// `decimal(12,2)` → (12, 2); MySQL's defaults are precision 10, scale 0.
fn decimal_digits(column_type: &str) -> (Option<u64>, Option<u64>) {
    let inner = column_type
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(inside, _)| inside);
    let mut parts = inner
        .unwrap_or("")
        .split(',')
        .map(|p| p.trim().parse().ok());
    let precision = parts.next().flatten().unwrap_or(10);
    let scale = parts.next().flatten().unwrap_or(0);
    (Some(precision), Some(scale))
}

/// A DEFAULT expression the way MariaDB's `information_schema` shows it (strings quoted, `NULL`),
/// which [`parse_default`](super::types::parse_default) reads.
fn default_text(expr: &Expr) -> String {
    expr.to_string()
}

fn object_name(name: &ObjectName) -> String {
    name.to_string().trim_matches('`').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, data_type: &str, column_type: &str, charset: Option<&str>) -> ColumnInfo {
        ColumnInfo {
            name: name.into(),
            data_type: data_type.into(),
            column_type: column_type.into(),
            numeric_precision: None,
            numeric_scale: None,
            charset: charset.map(str::to_owned),
            nullable: false,
            json_check: false,
            default: None,
            former_names: Vec::new(),
            srid: None,
        }
    }

    fn table() -> Vec<ColumnInfo> {
        vec![
            col("id", "int", "int(11)", None),
            col("name", "varchar", "varchar(20)", Some("latin1")),
            col("qty", "smallint", "smallint(6)", None),
        ]
    }

    #[test]
    fn add_column_at_the_end_nullable_without_default() {
        let next = apply_alter(
            "ALTER TABLE `shop`.`t` ADD COLUMN note varchar(40), ADD `price` decimal(12,2) NULL DEFAULT NULL, ADD INDEX (qty)",
            &table(),
            "utf8mb4",
        )
        .unwrap();
        assert_eq!(next.len(), 5);
        assert_eq!(next[3].name, "note");
        assert_eq!(next[3].data_type, "varchar");
        assert_eq!(next[3].charset.as_deref(), Some("utf8mb4"));
        assert!(next[3].nullable);
        assert_eq!(next[4].data_type, "decimal");
        assert_eq!(
            (next[4].numeric_precision, next[4].numeric_scale),
            (Some(12), Some(2))
        );
        assert_eq!(next[4].default, None);
        let unsigned =
            apply_alter("ALTER TABLE t ADD u int unsigned", &table(), "utf8mb4").unwrap();
        assert!(unsigned[3].column_type.contains("unsigned"));
        assert_eq!(unsigned[3].data_type, "int");
    }

    #[test]
    fn added_constant_defaults_are_what_existing_rows_read() {
        let next = apply_alter(
            "ALTER TABLE t ADD c int NOT NULL DEFAULT 7, ADD s varchar(5) DEFAULT 'it''s', ADD n int DEFAULT NULL",
            &table(),
            "utf8mb4",
        )
        .unwrap();
        assert_eq!(added_default(&next[3]).unwrap().as_deref(), Some("7"));
        assert!(!next[3].nullable);
        assert_eq!(added_default(&next[4]).unwrap().as_deref(), Some("it's"));
        assert_eq!(added_default(&next[5]).unwrap(), None);
    }

    #[test]
    fn drop_column_removes_it_in_place() {
        let next = apply_alter("ALTER TABLE t DROP COLUMN qty, DROP name", &table(), "x").unwrap();
        assert_eq!(next, table()[..1].to_vec());
        assert!(apply_alter("ALTER TABLE t DROP COLUMN nope", &table(), "x").is_err());
    }

    #[test]
    fn modify_widens_in_place_and_keeps_the_charset() {
        let next = apply_alter(
            "ALTER TABLE t MODIFY qty bigint, MODIFY COLUMN name varchar(200) NOT NULL",
            &table(),
            "utf8mb4",
        )
        .unwrap();
        assert_eq!(next[2].data_type, "bigint");
        assert!(
            next[2].nullable,
            "MODIFY without NOT NULL makes it nullable"
        );
        assert_eq!(next[1].column_type, "varchar(200)");
        assert_eq!(next[1].charset.as_deref(), Some("latin1"));
        assert!(!next[1].nullable);
        let changed = apply_alter("ALTER TABLE t CHANGE qty qty int", &table(), "utf8mb4").unwrap();
        assert_eq!(changed[2].data_type, "int");
    }

    #[test]
    fn defaults_and_no_op_operations() {
        let next = apply_alter(
            "ALTER TABLE t ALTER COLUMN qty SET DEFAULT 5, ALGORITHM=INPLACE, LOCK=NONE",
            &table(),
            "utf8mb4",
        )
        .unwrap();
        assert_eq!(next[2].default.as_deref(), Some("5"));
        let dropped =
            apply_alter("ALTER TABLE t ALTER qty DROP DEFAULT", &next, "utf8mb4").unwrap();
        assert_eq!(dropped[2].default, None);
        let same = apply_alter(
            "ALTER TABLE t ADD INDEX qty_ix (qty), DROP INDEX other_ix",
            &table(),
            "utf8mb4",
        )
        .unwrap();
        assert_eq!(same, table());
    }

    #[test]
    fn renames_keep_the_column_in_place_and_remember_its_names() {
        let next = apply_alter(
            "ALTER TABLE t RENAME COLUMN qty TO amount, ADD note text",
            &table(),
            "utf8mb4",
        )
        .unwrap();
        assert_eq!(next[2].name, "amount");
        assert_eq!(next[2].former_names, ["qty"]);
        assert_eq!(next[2].column_type, "smallint(6)", "only the name changes");
        assert_eq!(next[3].name, "note");
        // CHANGE renames and redefines at once; the names add up.
        let again = apply_alter("ALTER TABLE t CHANGE amount total int", &next, "utf8mb4").unwrap();
        assert_eq!(again[2].name, "total");
        assert_eq!(again[2].data_type, "int");
        assert_eq!(again[2].former_names, ["qty", "amount"]);
        // Back to an earlier name: that name leaves the former ones.
        let back = apply_alter(
            "ALTER TABLE t RENAME COLUMN total TO qty",
            &again,
            "utf8mb4",
        )
        .unwrap();
        assert_eq!(back[2].former_names, ["amount", "total"]);
        // MODIFY and a CHANGE under the same name are no rename.
        let same = apply_alter("ALTER TABLE t CHANGE qty qty int", &table(), "utf8mb4").unwrap();
        assert!(same[2].former_names.is_empty());
    }

    #[test]
    fn what_is_not_applied_is_an_error_naming_it() {
        let cases = [
            (
                "ALTER TABLE t RENAME COLUMN qty TO name",
                "name already exists",
            ),
            (
                "ALTER TABLE t RENAME COLUMN nope TO x",
                "nope does not exist",
            ),
            (
                "ALTER TABLE t ADD c int NOT NULL",
                "NOT NULL without a default",
            ),
            (
                "ALTER TABLE t ADD c datetime DEFAULT CURRENT_TIMESTAMP",
                "an expression",
            ),
            ("ALTER TABLE t ADD c int FIRST", "FIRST or AFTER"),
            ("ALTER TABLE t ADD c int AFTER id", "FIRST or AFTER"),
            ("ALTER TABLE t MODIFY qty int AFTER id", "moved"),
            ("ALTER TABLE t ADD PRIMARY KEY (qty)", "primary key"),
            ("ALTER TABLE t DROP PRIMARY KEY", "primary key"),
            ("ALTER TABLE t ADD id int", "already exists"),
            ("ALTER TABLE t MODIFY nope int", "nope does not exist"),
            ("ALTER TABLE t ADD j json", "JSON"),
            (
                "ALTER TABLE t DROP COLUMN qty, ADD COLUMN qty int",
                "dropped and added again",
            ),
            ("ALTER TABLE t FROB", "cannot be parsed"),
        ];
        for (sql, wanted) in cases {
            let err = apply_alter(sql, &table(), "utf8mb4").unwrap_err();
            assert!(err.0.contains(wanted), "{sql}: {err}");
        }
    }
}
