"""residents: AI residents in Discord rooms that tell the truth about every output."""
