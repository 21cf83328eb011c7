"""Operations an admin runs on a data dir: consistency audit and repair, backup and restore."""
