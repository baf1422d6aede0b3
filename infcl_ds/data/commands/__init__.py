"""The data commands: `infcl-ds data digits|photos` (shards to try the trainer on) and
`infcl-ds data check` (a recipe's data paths exist and read as the trainer reads them)."""
