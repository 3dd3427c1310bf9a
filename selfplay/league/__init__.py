"""The league: who is in the population, who plays whom, how they rate, and the store that
keeps it all across crashes."""
