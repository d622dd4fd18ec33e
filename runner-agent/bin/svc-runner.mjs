#!/usr/bin/env node
// Runs the TypeScript CLI through tsx (the workspace runs TypeScript directly; a published
// build would point this at compiled JavaScript instead).
import { register } from 'tsx/esm/api';

register();
await import('../src/cli.ts');
