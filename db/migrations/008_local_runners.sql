-- Runners the instance starts itself for the `local` sandbox provider (one runner-agent child
-- process per sandbox) are runners like any other on the wire, but not the owner's machines:
-- they are not listed and go with their sandbox.
ALTER TABLE runners ADD COLUMN kind text NOT NULL DEFAULT 'self' CHECK (kind IN ('self', 'local'));
