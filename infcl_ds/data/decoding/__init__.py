"""How samples become pixels: the transforms, host batches (decoded or encoded) and their
normalisation, the decode pieces and the workers that decode them ahead (the process pool, the
GPU decoder's lane), and page-locked host memory."""
