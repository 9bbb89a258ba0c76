-- One name per concept: the lineage tables already key on work_context_id; the
-- runs, workspaces and holds that carry the same identity called it task_id.
ALTER TABLE runs RENAME COLUMN task_id TO work_context_id;
ALTER TABLE workspaces RENAME COLUMN task_id TO work_context_id;
ALTER TABLE holds RENAME COLUMN task_id TO work_context_id;
