"""HEP CNN: RPV-SUSY signal vs QCD background on calorimeter images
(Kurth et al., "Deep Learning at 15PF", SC17), judged against the cut-based
selection the physicists use."""
